package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"sturdy/internal/otlptest"
	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// Anthropic Messages API events, as a server streams them.
const (
	msgStart    = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n"
	msgPing     = "event: ping\ndata: {\"type\":\"ping\"}\n\n"
	msgBlock    = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
	msgDelta    = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n"
	msgEnd      = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	msgOverload = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	msgRequest  = `{"model":"claude-x","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
)

// TestTheMessagesAPIIsRetriedAndCommittedOnContent: /v1/messages (with
// Claude Code's ?beta=true) is an inference call, retried on every reason
// — a 529 too — and its stream commits at its first content, so an
// overloaded_error or a cut after message_start, ping and an empty text
// block is retried whole: the client sees one clean stream.
func TestTheMessagesAPIIsRetriedAndCommittedOnContent(t *testing.T) {
	t.Parallel()
	whole := sseStep(msgStart, msgBlock, msgDelta, msgEnd)
	for _, tc := range []struct {
		name  string
		first upstreamtest.Step
	}{
		{"a 529", upstreamtest.Step{Status: 529, Header: [][2]string{upstreamtest.JSONHeader}, Body: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`}},
		{"an overloaded_error after message_start", sseStep(msgStart, msgPing, msgOverload)},
		{"a cut after the empty block's start", upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{msgStart, msgPing, msgBlock}, Fault: upstreamtest.Cut}},
		{"a reset before any reply", upstreamtest.Step{Fault: upstreamtest.Reset}},
	} {
		up := upstreamtest.Start(t, tc.first, whole)
		h := startProxy(t, up.URL, nil)
		resp, body := h.do("POST", "/v1/messages?beta=true", msgRequest, "Content-Type", "application/json", "anthropic-version", "2023-06-01",
			"anthropic-beta", "fine-grained-tool-streaming-2025-05-14", "x-api-key", "sk-ant-client")
		if want := msgStart + msgBlock + msgDelta + msgEnd; resp.StatusCode != 200 || string(body) != want || up.Count() != 2 {
			t.Errorf("%s: %d after %d attempts:\n%s", tc.name, resp.StatusCode, up.Count(), body)
		}
		if hd := up.Requests()[1].Header; hd["Anthropic-Version"] != "2023-06-01" || hd["Anthropic-Beta"] != "fine-grained-tool-streaming-2025-05-14" || hd["X-Api-Key"] != "sk-ant-client" {
			t.Errorf("%s: the Anthropic headers upstream: %v", tc.name, hd)
		}
	}
}

// TestAMessagesStreamEndsCleanOnlyAtItsStop: a stream that ends with
// message_stop is whole; one cut after its content is incomplete, and the
// client is told so in-band, never given a clean end.
func TestAMessagesStreamEndsCleanOnlyAtItsStop(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, sseStep(msgStart, msgBlock, msgDelta, msgEnd))
	h := startProxy(t, up.URL, nil)
	if _, body := h.do("POST", "/v1/messages", msgRequest); !strings.HasSuffix(string(body), "message_stop\"}\n\n") {
		t.Fatalf("a whole stream:\n%s", body)
	}
	if l := h.accessLines(1); l[0]["outcome"] != "ok" {
		t.Fatalf("a whole stream logged %v", l[0]["outcome"])
	}
	cut := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{msgStart, msgBlock, msgDelta}, Fault: upstreamtest.Cut})
	h = startProxy(t, cut.URL, nil)
	_, body := h.do("POST", "/v1/messages", msgRequest)
	tail, ok := strings.CutPrefix(string(body), msgStart+msgBlock+msgDelta)
	if ev := gjson.Get(strings.TrimPrefix(tail, "event: error\ndata: "), "error"); !ok || !strings.HasPrefix(tail, "event: error\ndata: ") ||
		ev.Get("type").Str != "api_error" || !strings.Contains(ev.Get("message").Str, "incomplete") || strings.Contains(tail, "message_stop") {
		t.Fatalf("a cut stream, not ended with Anthropic's error event:\n%s", body)
	}
	if l := h.accessLines(1); l[0]["outcome"] != "stream_interrupted" {
		t.Fatalf("a cut stream logged %v", l[0]["outcome"])
	}
}

// TestSturdysOwnErrorsOnTheMessagesAPIAreAnthropics: what Sturdy answers
// itself on a Messages API path has Anthropic's shape (type error, the
// error's Anthropic type and message, request_id; Sturdy's code under
// "sturdy"), with x-should-retry: false on giving up.
func TestSturdysOwnErrorsOnTheMessagesAPIAreAnthropics(t *testing.T) {
	t.Parallel()
	h := startProxy(t, "http://127.0.0.1:1", func(o *Options) { o.Routes[0].Retry.MaxAttempts = 2 }) // nothing listens on port 1
	resp, body := h.do("POST", "/v1/messages", msgRequest)
	b := gjson.ParseBytes(body)
	if resp.StatusCode != 502 || b.Get("type").Str != "error" || b.Get("error.type").Str != "api_error" ||
		b.Get("sturdy.code").Str != CodeRetriesExhausted || b.Get("request_id").Str != resp.Header.Get("X-Request-Id") ||
		resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	// Chat completions keep OpenAI's shape.
	if _, body := h.chat(""); gjson.GetBytes(body, "error.code").Str != CodeRetriesExhausted {
		t.Fatalf("chat: %s", body)
	}
}

// TestAnthropicQuotaHeadersStartACooldown: a reply saying one of
// Anthropic's quotas is spent (anthropic-ratelimit-*-remaining: 0, with
// its RFC 3339 reset) holds the next request of that credential and model
// until the reset, answered as Anthropic's rate_limit_error.
func TestAnthropicQuotaHeadersStartACooldown(t *testing.T) {
	t.Parallel()
	reset := time.Now().Add(20 * time.Second).UTC().Format(time.RFC3339)
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader,
		{"Anthropic-Ratelimit-Input-Tokens-Remaining", "0"}, {"Anthropic-Ratelimit-Input-Tokens-Reset", reset}},
		Chunks: []string{msgStart, msgBlock, msgDelta, msgEnd}}, upstreamtest.Step{Body: "too soon"})
	h := startProxy(t, up.URL, nil)
	if resp, _ := h.do("POST", "/v1/messages", msgRequest, "x-api-key", "sk-ant-a"); resp.StatusCode != 200 {
		t.Fatalf("the last one: %d", resp.StatusCode)
	}
	resp, body := h.do("POST", "/v1/messages", msgRequest, "x-api-key", "sk-ant-a")
	if resp.StatusCode != 429 || gjson.GetBytes(body, "error.type").Str != "rate_limit_error" || up.Count() != 1 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the spent quota was not learned: %d %s, upstream saw %d", resp.StatusCode, body, up.Count())
	}
}

// TestAnthropicBillingAndFailoverCodes: a 402 billing_error is a spent
// quota — passed through untouched with x-should-retry: false, never
// retried, and failed over where the route has another target — and
// failover_codes match Anthropic's error.type (it has no error.code).
func TestAnthropicBillingAndFailoverCodes(t *testing.T) {
	t.Parallel()
	const billing = `{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low"}}`
	spent := upstreamtest.Step{Status: 402, Header: [][2]string{upstreamtest.JSONHeader}, Body: billing}
	alone := upstreamtest.Start(t, spent)
	h := startProxy(t, alone.URL, nil)
	if resp, body := h.do("POST", "/v1/messages", msgRequest); resp.StatusCode != 402 || string(body) != billing ||
		resp.Header.Get("X-Should-Retry") != "false" || alone.Count() != 1 {
		t.Fatalf("alone: %d %s %v, upstream saw %d", resp.StatusCode, body, resp.Header, alone.Count())
	}
	primary := upstreamtest.Start(t, spent)
	other := upstreamtest.Start(t, sseStep(msgStart, msgBlock, msgDelta, msgEnd))
	h = startProxy(t, primary.URL, func(o *Options) { withFallbacks(o, []string{other.URL}) })
	if resp, body := h.do("POST", "/v1/messages", msgRequest); resp.StatusCode != 200 || !strings.HasSuffix(string(body), "message_stop\"}\n\n") || primary.Count() != 1 {
		t.Fatalf("with a fallback: %d %s, primary saw %d", resp.StatusCode, body, primary.Count())
	}
	tooLong := upstreamtest.Start(t, upstreamtest.Step{Status: 400, Header: [][2]string{upstreamtest.JSONHeader},
		Body: `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 250000 tokens > 200000 maximum"}}`})
	bigger := upstreamtest.Start(t, sseStep(msgStart, msgBlock, msgDelta, msgEnd))
	h = startProxy(t, tooLong.URL, func(o *Options) {
		withFallbacks(o, []string{bigger.URL})
		o.Routes[0].FailoverCodes = []string{"invalid_request_error"}
	})
	if resp, _ := h.do("POST", "/v1/messages", msgRequest); resp.StatusCode != 200 || bigger.Count() != 1 {
		t.Fatalf("failover_codes on error.type: %d, the fallback saw %d", resp.StatusCode, bigger.Count())
	}
}

// TestOneCredentialRule: a request's credential is its Authorization,
// else its x-api-key — what auth.keys accepts, what tells clients apart
// under the default key_header — and an upstream's api_key goes as
// x-api-key on the Messages API's paths (Bearer with api_key_header: authorization, and
// on every other path), never beside the client's.
func TestOneCredentialRule(t *testing.T) {
	t.Parallel()
	whole := sseStep(msgStart, msgBlock, msgDelta, msgEnd)
	up := upstreamtest.Start(t, whole)
	h := startProxy(t, up.URL, func(o *Options) { o.AuthKeys = []string{"sturdy-key-aaaaaaaaaaaa"} })
	if resp, _ := h.do("POST", "/v1/messages", msgRequest, "x-api-key", "sturdy-key-aaaaaaaaaaaa"); resp.StatusCode != 200 {
		t.Fatalf("auth.keys by x-api-key: %d", resp.StatusCode)
	}
	if resp, _ := h.do("POST", "/v1/messages", msgRequest, "x-api-key", "sturdy-key-wrong-wrong"); resp.StatusCode != 401 {
		t.Fatalf("a wrong x-api-key: %d", resp.StatusCode)
	}
	if hd := up.Requests()[0].Header; hd["X-Api-Key"] != "" || hd["Authorization"] != "" {
		t.Fatalf("Sturdy's own key went upstream: %v", hd)
	}

	for _, tc := range []struct {
		name, path    string
		bearer        bool
		xAPI, bearerV string
	}{
		{"messages", "/v1/messages", false, "sk-ant-upstream", ""},
		{"messages, api_key_header: authorization", "/v1/messages", true, "", "Bearer sk-ant-upstream"},
		{"chat", "/v1/chat/completions", false, "", "Bearer sk-ant-upstream"},
	} {
		up := upstreamtest.Start(t, whole)
		h := startProxy(t, up.URL, func(o *Options) {
			o.Upstreams[0].APIKey = "sk-ant-upstream"
			if tc.bearer {
				o.Upstreams[0].APIKeyHeader = "authorization"
			}
		})
		h.do("POST", tc.path, msgRequest, "x-api-key", "sk-client", "Authorization", "Bearer sk-client")
		if hd := up.Requests()[0].Header; hd["X-Api-Key"] != tc.xAPI || hd["Authorization"] != tc.bearerV {
			t.Errorf("%s: x-api-key %q, Authorization %q upstream", tc.name, hd["X-Api-Key"], hd["Authorization"])
		}
	}

	// A fallback with no api_key of its own gets the client's x-api-key
	// back, after a primary that sent its own.
	failing := upstreamtest.Start(t, upstreamtest.Step{Status: 503})
	plain := upstreamtest.Start(t, whole)
	h = startProxy(t, failing.URL, func(o *Options) {
		o.Upstreams[0].APIKey = "sk-ant-primary"
		withFallbacks(o, []string{plain.URL})
	})
	if resp, _ := h.do("POST", "/v1/messages", msgRequest, "x-api-key", "sk-client"); resp.StatusCode != 200 || plain.Requests()[0].Header["X-Api-Key"] != "sk-client" {
		t.Fatalf("the fallback: %d, x-api-key %q", resp.StatusCode, plain.Requests()[0].Header["X-Api-Key"])
	}

	// Clients told apart by x-api-key under the default key_header.
	many := upstreamtest.Start(t, whole)
	h = startProxy(t, many.URL, func(o *Options) { o.Clients = []ClientLimit{{RequestsPerSecond: 0.5, Burst: 1}} })
	codes := ""
	for _, k := range []string{"sk-a", "sk-b", "sk-a"} {
		resp, _ := h.do("POST", "/v1/messages", msgRequest, "x-api-key", k)
		codes += fmt.Sprint(resp.StatusCode, " ")
	}
	if codes != "200 200 429 " {
		t.Fatalf("two x-api-key clients, one twice: %s", codes)
	}
}

// TestAMessagesRequestIsTracedAsAnthropics: the server span names the
// provider by the API spoken (gen_ai.provider.name anthropic) and reads
// the usage as Anthropic streams it (input in message_start, output in
// the last message_delta).
func TestAMessagesRequestIsTracedAsAnthropics(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	up := upstreamtest.Start(t, sseStep(msgStart, msgBlock, msgDelta, msgEnd))
	h := startProxy(t, up.URL, func(o *Options) { withTracing(t, o, rcv, 1) })
	if resp, _ := h.do("POST", "/v1/messages", msgRequest, "traceparent", clientTraceparent); resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	root, _ := serverSpan(t, rcv, "4bf92f3577b34da6a3ce929d0e0e4736", 1)
	if root.Attrs["gen_ai.provider.name"] != "anthropic" || root.Attrs["gen_ai.operation.name"] != "chat" ||
		root.Attrs["gen_ai.usage.input_tokens"] != int64(9) || root.Attrs["gen_ai.usage.output_tokens"] != int64(2) {
		t.Fatalf("server span %v", root.Attrs)
	}
}

// TestAnUpstreamServesTheAPIsItDeclares: no translation between the two
// APIs — a target whose upstream declares apis without the request's is
// passed over (result unsupported_api in the access log), and a route
// with no target for it answers api_not_served.
func TestAnUpstreamServesTheAPIsItDeclares(t *testing.T) {
	t.Parallel()
	openaiOnly := upstreamtest.Start(t, upstreamtest.Step{Body: "chat"})
	anthropic := upstreamtest.Start(t, sseStep(msgStart, msgBlock, msgDelta, msgEnd))
	h := startProxy(t, openaiOnly.URL, func(o *Options) {
		o.Upstreams[0].APIs = upstream.ServesOpenAI
		withFallbacks(o, []string{anthropic.URL})
		o.Upstreams[1].APIs = upstream.ServesAnthropic
	})
	if resp, body := h.do("POST", "/v1/messages", msgRequest); resp.StatusCode != 200 || openaiOnly.Count() != 0 || anthropic.Count() != 1 {
		t.Fatalf("messages: %d %s; the openai-only upstream saw %d", resp.StatusCode, body, openaiOnly.Count())
	}
	if l := h.accessLines(1)[0]; fmt.Sprint(l["targets"]) != "[map[attempts:0 result:unsupported_api upstream:up] map[attempts:1 endpoint:"+strings.TrimPrefix(anthropic.URL, "http://")+" result:success upstream:b]]" {
		t.Fatalf("access line targets: %v", l["targets"])
	}
	if resp, body := h.chat(""); resp.StatusCode != 200 || string(body) != "chat" || anthropic.Count() != 1 {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
	only := startProxy(t, openaiOnly.URL, func(o *Options) { o.Upstreams[0].APIs = upstream.ServesOpenAI })
	resp, body := only.do("POST", "/v1/messages", msgRequest)
	if resp.StatusCode != 404 || gjson.GetBytes(body, "sturdy.code").Str != CodeAPINotServed || gjson.GetBytes(body, "error.type").Str != "not_found_error" {
		t.Fatalf("no target serves it: %d %s", resp.StatusCode, body)
	}
}

// Messages API events for a rescue: text deltas of block i, a block's
// start (text or tool_use) and stop, a continuing server's message_start
// and its end.
func msgText(i int, text string) string {
	return fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"text_delta\",\"text\":%q}}\n\n", i, text)
}

func msgBlockAt(i int, kind string) string {
	block := `{"type":"text","text":""}`
	switch kind {
	case "tool_use":
		block = `{"type":"tool_use","id":"toolu_1","name":"f","input":{}}`
	case "thinking":
		block = `{"type":"thinking","thinking":""}`
	}
	return fmt.Sprintf("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":%d,\"content_block\":%s}\n\n", i, block)
}

func msgStop(i int) string {
	return fmt.Sprintf("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":%d}\n\n", i)
}

func msgFinish(outputTokens int) string {
	return fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":%d}}\n\n", outputTokens) +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
}

const msgStart2 = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n"

// TestACutMessagesStreamIsContinued: a Messages API stream that fails
// after text content — cut, stalled past idle, an overloaded_error — goes
// on as one stream from a fallback that continues a prefill: the
// message_start (its id) the first one's, the continuation's message_start
// and first text block start dropped, its indexes mapped onto the cut
// block (or, when the cut block had stopped, after it), the prefill's
// trailing whitespace stripped and not sent twice, the output tokens of
// both attempts in the final message_delta, one message_stop.
func TestACutMessagesStreamIsContinued(t *testing.T) {
	t.Parallel()
	head := msgStart + msgBlock + msgText(0, "Hel") + msgText(0, "lo ")
	cont := sseStep(msgStart2, msgPing, msgBlockAt(0, "text"), msgText(0, " wor"), msgText(0, "ld"), msgStop(0), msgFinish(3))
	joined := msgPing + msgText(0, "wor") + msgText(0, "ld") + msgStop(0) + strings.Replace(msgFinish(3), `"output_tokens":3`, `"output_tokens":5`, 1)
	for _, tt := range []struct {
		name         string
		first, cont  upstreamtest.Step
		body         string
		want         string // after what the first attempt streamed
		prefill      string // the continuation's trailing assistant message
		prefillIndex int    // its place in messages
	}{
		{"cut mid-block", upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{head}, Fault: upstreamtest.Cut},
			cont, msgRequest, joined, "Hello", 1},
		{"stalled past idle", upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{head}, Fault: upstreamtest.Stall},
			cont, msgRequest, joined, "Hello", 1},
		{"an overloaded_error", sseStep(head, msgOverload), cont, msgRequest, joined, "Hello", 1},
		{"the client's own prefill", upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{head}, Fault: upstreamtest.Cut},
			cont, `{"model":"claude-x","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Say:"}]}`,
			joined, "Say:Hello", 1},
		{"cut after the block's stop", upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{head + msgStop(0)}, Fault: upstreamtest.Cut},
			cont, msgRequest,
			msgStop(0) + msgPing + strings.Replace(msgBlockAt(0, "text"), `"index":0`, `"index":1`, 1) + msgText(1, "wor") + msgText(1, "ld") + msgStop(1) +
				strings.Replace(msgFinish(3), `"output_tokens":3`, `"output_tokens":5`, 1), "Hello", 1},
		{"a continuation in one chunk, its space apart", upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{head}, Fault: upstreamtest.Cut},
			sseStep(msgStart2+msgBlockAt(0, "text")+msgText(0, " "), msgText(0, "wor"), msgText(0, "ld"), msgStop(0), msgFinish(3)), msgRequest,
			msgText(0, "wor") + msgText(0, "ld") + msgStop(0) + strings.Replace(msgFinish(3), `"output_tokens":3`, `"output_tokens":5`, 1), "Hello", 1},
		{"a continuation that calls a tool", upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{head}, Fault: upstreamtest.Cut},
			sseStep(msgStart2, msgBlockAt(0, "tool_use"), msgStop(0), msgFinish(4)), msgRequest,
			msgStop(0) + strings.Replace(msgBlockAt(0, "tool_use"), `"index":0`, `"index":1`, 1) + msgStop(1) +
				strings.Replace(msgFinish(4), `"output_tokens":4`, `"output_tokens":6`, 1), "Hello", 1},
		{"a continuation that adds only its end", upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{head}, Fault: upstreamtest.Cut},
			sseStep(msgStart2, msgFinish(1)), msgRequest, msgStop(0) + strings.Replace(msgFinish(1), `"output_tokens":1`, `"output_tokens":3`, 1), "Hello", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			primary, fallback := upstreamtest.Start(t, tt.first), upstreamtest.Start(t, tt.cont)
			h := startRescue(t, primary, fallback, upstream.ContinuePrefill, nil)
			resp, body := h.do("POST", "/v1/messages", tt.body, "Content-Type", "application/json", "x-api-key", "sk-ant-client")
			if want := head + tt.want; resp.StatusCode != 200 || string(body) != want {
				t.Fatalf("%d:\n%s\nwant\n%s", resp.StatusCode, body, want)
			}
			checkMessagesStream(t, body)
			reqs := fallback.Requests()
			if len(reqs) != 1 {
				t.Fatalf("the fallback saw %d requests", len(reqs))
			}
			sent := gjson.ParseBytes(reqs[0].Body)
			last := sent.Get("messages.@reverse.0")
			if sent.Get("model").Str != "other" || last.Get("role").Str != "assistant" || last.Get("content").Str != tt.prefill ||
				sent.Get("messages.#").Int() != int64(tt.prefillIndex+1) || sent.Get("continue_final_message").Exists() {
				t.Fatalf("continuation request %s", reqs[0].Body)
			}
			if line := h.accessLines(1)[0]; line["outcome"] != "ok" || line["rescued"] != 1.0 || line["rescued_by"] != "fb" {
				t.Fatalf("access line %v", line)
			}
		})
	}
}

// TestNoMessagesContinuationWhereItWouldCorrupt: a Messages API stream
// cut inside or after a tool_use block, with a thinking block, after its
// stop_reason, or whose request turns extended thinking on, ends with the
// in-band error (never message_stop); nothing is sent to the fallback.
func TestNoMessagesContinuationWhereItWouldCorrupt(t *testing.T) {
	t.Parallel()
	text := msgBlock + msgText(0, "Hel")
	toolJSON := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\"}}\n\n"
	for _, tt := range []struct {
		name, body, streamed string
	}{
		{"inside a tool_use block", msgRequest, text + msgStop(0) + msgBlockAt(1, "tool_use") + toolJSON},
		{"after a tool_use block", msgRequest, msgBlockAt(0, "tool_use") + msgStop(0) + msgBlockAt(1, "text") + msgText(1, "so")},
		{"with a thinking block", msgRequest, msgBlockAt(0, "thinking") +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n" +
			msgStop(0) + msgBlockAt(1, "text") + msgText(1, "Hi")},
		{"after its stop_reason", msgRequest, text + msgStop(0) + strings.TrimSuffix(msgFinish(2), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")},
		{"extended thinking asked for", `{"model":"claude-x","max_tokens":4096,"stream":true,"thinking":{"type":"enabled","budget_tokens":2048},"messages":[{"role":"user","content":"hi"}]}`, text},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			first := upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{msgStart + tt.streamed}, Fault: upstreamtest.Cut}
			primary := upstreamtest.Start(t, first)
			fallback := upstreamtest.Start(t, sseStep(msgStart2, msgBlock, msgText(0, "world"), msgStop(0), msgFinish(2)))
			h := startRescue(t, primary, fallback, upstream.ContinuePrefill, nil)
			resp, body := h.do("POST", "/v1/messages", tt.body, "Content-Type", "application/json")
			s := string(body)
			if resp.StatusCode != 200 || !strings.HasPrefix(s, msgStart+tt.streamed+"event: error\n") || strings.Contains(s, "message_stop") ||
				strings.Contains(s, "world") {
				t.Fatalf("%d:\n%s", resp.StatusCode, s)
			}
			if fallback.Count() != 0 {
				t.Fatalf("the fallback was sent %d requests", fallback.Count())
			}
			if line := h.accessLines(1)[0]; line["outcome"] != "stream_interrupted" || line["rescue_refused"] != "unsafe" {
				t.Fatalf("access line %v", line)
			}
		})
	}
}

// TestStreamHoldRestartsAMessagesStream: with stream_hold, a Messages API
// stream cut inside the window is retried from scratch; the client sees
// the retry's stream alone.
func TestStreamHoldRestartsAMessagesStream(t *testing.T) {
	t.Parallel()
	whole := sseStep(msgStart, msgBlock, msgDelta, msgEnd)
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{msgStart, msgBlock, msgText(0, "Hel")},
		Fault: upstreamtest.Cut}, whole)
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].StreamHold = StreamHold{Max: 5 * time.Second, Bytes: 64 << 10} })
	resp, body := h.do("POST", "/v1/messages", msgRequest, "Content-Type", "application/json")
	if want := strings.Join(whole.Chunks, ""); resp.StatusCode != 200 || string(body) != want || up.Count() != 2 {
		t.Fatalf("%d after %d attempts:\n%s", resp.StatusCode, up.Count(), body)
	}
}

// checkMessagesStream fails t unless body is a valid Messages API stream:
// one message_start first, blocks started in order from 0 with no gap,
// deltas and stops only for the open block, none open at message_delta
// or message_stop, one message_stop and nothing after it. It returns the
// text of the text deltas and the last output_tokens.
func checkMessagesStream(t *testing.T, body []byte) (text string, outputTokens int64) {
	t.Helper()
	var b strings.Builder
	next, open, starts, stops := int64(0), int64(-1), 0, 0
	for i, ev := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		_, data, _ := strings.Cut(ev, "data: ")
		d := gjson.Parse(data)
		typ, idx := d.Get("type").Str, d.Get("index").Int()
		if stops > 0 {
			t.Fatalf("event %d after message_stop: %s", i, ev)
		}
		switch typ {
		case "message_start":
			if starts++; i != 0 || starts > 1 {
				t.Fatalf("message_start at event %d:\n%s", i, body)
			}
		case "content_block_start":
			if open >= 0 || idx != next {
				t.Fatalf("block %d started (open %d, next %d):\n%s", idx, open, next, body)
			}
			open, next = idx, next+1
			b.WriteString(d.Get("content_block.text").Str)
		case "content_block_delta":
			if idx != open {
				t.Fatalf("a delta of block %d (open %d):\n%s", idx, open, body)
			}
			b.WriteString(d.Get("delta.text").Str)
		case "content_block_stop":
			if idx != open {
				t.Fatalf("a stop of block %d (open %d):\n%s", idx, open, body)
			}
			open = -1
		case "message_delta", "message_stop":
			if open >= 0 {
				t.Fatalf("%s with block %d open:\n%s", typ, open, body)
			}
			if typ == "message_stop" {
				stops++
			} else {
				outputTokens = d.Get("usage.output_tokens").Int()
			}
		case "ping":
		default:
			t.Fatalf("event %d: %s", i, ev)
		}
	}
	if stops != 1 {
		t.Fatalf("%d message_stop:\n%s", stops, body)
	}
	return b.String(), outputTokens
}

// TestMessagesRescuesMakeOneValidStream: whatever the seams — two
// rescues in a row, events that carry their type only in their data, a
// continuation that never sends a message_delta — the client's stream is
// one valid Messages API stream with the whole text.
func TestMessagesRescuesMakeOneValidStream(t *testing.T) {
	t.Parallel()
	cut := func(events ...string) upstreamtest.Step {
		return upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: events, Fault: upstreamtest.Cut}
	}
	unnamed := func(events string) string { // the same events without their event: lines
		var b strings.Builder
		for _, line := range strings.SplitAfter(events, "\n") {
			if !strings.HasPrefix(line, "event: ") {
				b.WriteString(line)
			}
		}
		return b.String()
	}
	for _, tc := range []struct {
		name   string
		script []upstreamtest.Step
		text   string
		tokens int64
	}{
		{"two rescues in a row", []upstreamtest.Step{
			cut(msgStart, msgBlock, msgText(0, "Hel")),
			cut(msgStart2, msgBlock, msgText(0, "lo "), msgText(0, "wor")),
			sseStep(msgStart2, msgBlock, msgText(0, "ld"), msgStop(0), msgFinish(2))},
			"Hello world", 2 + 1 + 2},
		{"a second cut after the continuation's block stopped", []upstreamtest.Step{
			cut(msgStart, msgBlock, msgText(0, "Hel")),
			cut(msgStart2, msgBlock, msgText(0, "lo"), msgStop(0)),
			sseStep(msgStart2, msgBlock, msgText(0, "!"), msgStop(0), msgFinish(1))},
			"Hello!", 1 + 1 + 1},
		{"events named only in their data", []upstreamtest.Step{
			cut(unnamed(msgStart), unnamed(msgBlock), unnamed(msgText(0, "Hel"))),
			sseStep(unnamed(msgStart2), unnamed(msgBlock), unnamed(msgText(0, "lo")), unnamed(msgStop(0)), unnamed(msgFinish(3)))},
			"Hello", 3 + 1},
		{"a continuation without a message_delta", []upstreamtest.Step{
			cut(msgStart, msgBlock, msgText(0, "Hello")),
			sseStep(msgStart2, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")},
			"Hello", 0},
		{"only whitespace before the cut", []upstreamtest.Step{
			cut(msgStart, msgBlock, msgText(0, " \n")),
			sseStep(msgStart2, msgBlock, msgText(0, "\nHi"), msgStop(0), msgFinish(1))},
			" \nHi", 1 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t, tc.script...)
			h := startProxy(t, up.URL, func(o *Options) {
				o.Upstreams[0].Continuation = upstream.ContinuePrefill
				o.Routes[0].MaxRescues = new(2)
			})
			resp, body := h.do("POST", "/v1/messages", msgRequest, "Content-Type", "application/json")
			text, tokens := checkMessagesStream(t, body)
			if resp.StatusCode != 200 || text != tc.text || tokens != tc.tokens || up.Count() != len(tc.script) {
				t.Fatalf("%d after %d attempts: %q, %d output tokens:\n%s", resp.StatusCode, up.Count(), text, tokens, body)
			}
		})
	}
}

// TestAVLLMTargetDoesNotContinueAMessagesStream: vLLM's /v1/messages has
// no continue_final_message (it would answer a prefill as a new turn), so
// a target with continuation: vllm is passed over for a Messages API
// rescue; one with prefill takes it.
func TestAVLLMTargetDoesNotContinueAMessagesStream(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{msgStart, msgBlock, msgText(0, "Hel")},
		Fault: upstreamtest.Cut})
	vllm := upstreamtest.Start(t, sseStep(msgStart2, msgBlock, msgText(0, "restarted"), msgStop(0), msgFinish(1)))
	prefill := upstreamtest.Start(t, sseStep(msgStart2, msgBlock, msgText(0, "lo"), msgStop(0), msgFinish(1)))
	h := startRescue(t, primary, vllm, upstream.ContinueVLLM, func(o *Options) {
		o.Upstreams = append(o.Upstreams, testUpstream("p", prefill.URL))
		o.Upstreams[2].Continuation = upstream.ContinuePrefill
		o.Routes[0].Fallbacks = append(o.Routes[0].Fallbacks, Target{Upstream: "p"})
	})
	_, body := h.do("POST", "/v1/messages", msgRequest, "Content-Type", "application/json")
	if text, _ := checkMessagesStream(t, body); text != "Hello" || vllm.Count() != 0 || prefill.Count() != 1 {
		t.Fatalf("%q; the vllm target saw %d requests, the prefill one %d", text, vllm.Count(), prefill.Count())
	}
}
