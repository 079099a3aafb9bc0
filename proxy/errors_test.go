package proxy

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
	"sturdy/listener"
	"sturdy/policy"
	"sturdy/upstream"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// TestTheErrorTableIsTheVocabulary checks the docs' table of error codes
// (docs/failures-and-retries.md) row for row against errorTable: same
// codes, statuses and words.
func TestTheErrorTableIsTheVocabulary(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/failures-and-retries.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "| code | status | Anthropic `error.type` | SDK may retry | when |\n|---|---|---|---|---|\n")
	if !ok {
		t.Fatal("docs/failures-and-retries.md has no error-code table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	var want []string
	for _, s := range errorTable {
		status := "—"
		if s.status != 0 {
			status = strconv.Itoa(s.status)
		}
		retry := "no"
		switch {
		case s.status == 0:
			retry = "—" // sent inside a stream
		case s.sdkRetries:
			retry = "yes"
		}
		want = append(want, "| `"+s.code+"` | "+status+" | `"+s.anthropic+"` | "+retry+" | "+s.when+" |")
	}
	got := strings.Split(strings.TrimSpace(table), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("docs/failures-and-retries.md's error table:\n%s\n\nerrorTable says:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestEveryErrorCodeHasOneRow(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, s := range errorTable {
		if seen[s.code] || s.message == "" || s.when == "" || (s.status != 0 && (s.status < 400 || s.status > 599)) {
			t.Errorf("bad row %+v", s)
		}
		seen[s.code] = true
	}
	for _, code := range []string{CodeBadRequest, CodeHeadersTooLarge, CodeRequestTooLarge, CodeRouteNotFound, CodeInvalidAPIKey,
		CodeRateLimited, CodeCircuitOpen, CodeUpstreamBusy, CodeUpstreamUnreachable, CodeRetriesExhausted, CodeUpstreamTimeout,
		CodeDeadlineExceeded, CodeShuttingDown, CodeStreamInterrupted} {
		if specOf(code).code != code {
			t.Errorf("%s has no row", code)
		}
	}
}

// TestTheLimitsTableNamesTheBounds: the Limits table (docs/limits.md)
// says each bound as the code has it.
func TestTheLimitsTableNamesTheBounds(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/limits.md")
	if err != nil {
		t.Fatal(err)
	}
	_, limits, ok := strings.Cut(string(doc), "# Limits\n")
	limits, _, _ = strings.Cut(limits, "\n## ")
	if !ok {
		t.Fatal("docs/limits.md has no Limits title")
	}
	for _, row := range []struct{ limit, says string }{
		{"request line + headers", sizeText(DefaultMaxHeaderBytes)},
		{"request body", sizeText(DefaultMaxBody)},
		{"open client connections", fmt.Sprintf("less %d", reservedFDs)},
		{"open client connections", fmt.Sprintf("at most %d answered", listener.MaxRefusing)},
		{"riders waiting out an outage", fmt.Sprintf("%d,%03d", upstream.DefaultRideThroughQueue/1000, upstream.DefaultRideThroughQueue%1000)},
		{"framing held before a stream's commit point", sizeText(maxHold)},
		{"rescue text", sizeText(DefaultMaxRescueBytes)},
		{"a body read whole for an HTTP/1.0 client", sizeText(maxWholeBody)},
		{"held stream heads, rescue text and HTTP/1.0 bodies", sizeText(DefaultMaxBufferedBytes)},
		{"request bodies held", sizeText(DefaultMaxRequestBytes)},
		{"how deep a request's text is followed", fmt.Sprintf("%d levels", policy.MaxTextDepth)},
		{"upstream response headers", sizeText(upstream.ReadBuffer) + "; " + fmt.Sprint(upstream.MaxInterimResponses) + "; " + sizeText(upstream.MaxTrailerBytes)},
		{"a model name as kept and shown", fmt.Sprintf("%d bytes", policy.MaxModelBytes)},
		{"reply breakers per endpoint", fmt.Sprintf("; %d |", upstream.MaxListedModelBreakers)},
		{"cooldowns per upstream", fmt.Sprintf("%d,%03d", upstream.MaxTrackedKeys/1000, upstream.MaxTrackedKeys%1000)},
		{"retries / targets listed", fmt.Sprintf("%d / %d; %d", maxLoggedRetries, maxLoggedTargets, maxTriedEndpoints)},
		{"a span's value copied from a request", sizeText(maxSpanText)},
		{"admin connections", fmt.Sprintf("%d;", AdminConnections)},
		{"one learned cooldown", fmt.Sprintf("%d min", int(upstream.DefaultCooldownMax.Minutes()))},
	} {
		line := ""
		for _, l := range strings.Split(limits, "\n") {
			if strings.HasPrefix(l, "| "+row.limit) {
				line = l
			}
		}
		if line == "" || !strings.Contains(line, row.says) {
			t.Errorf("Limits row %q does not say %q: %q", row.limit, row.says, line)
		}
	}
}

// TestEveryAPIHasAnErrorShape: every API's row renders a body an SDK of
// that API parses (error.code, error.type) and an SSE error event.
func TestEveryAPIHasAnErrorShape(t *testing.T) {
	t.Parallel()
	e := newError(CodeRetriesExhausted, 3, "up", "503")
	for _, tt := range []struct {
		api   policy.API
		event string // the SSE event's first line
		// code and typ are where the body says the code, and its type
		code, typ, wantType string
	}{
		{policy.APIOther, "data: {", "error.code", "error.type", ErrorType},
		{policy.APIChat, "data: {", "error.code", "error.type", ErrorType},
		{policy.APICompletions, "data: {", "error.code", "error.type", ErrorType},
		{policy.APIResponses, "event: error", "error.code", "error.type", ErrorType},
		{policy.APIOllama, "data: {", "error.code", "error.type", ErrorType},
		{policy.APIAnthropic, "event: error", "sturdy.code", "error.type", "api_error"},
	} {
		sh := shapeOf(tt.api)
		if b := gjson.ParseBytes(sh.body(e, []byte("req-1"))); b.Get(tt.code).Str != CodeRetriesExhausted || b.Get(tt.typ).Str != tt.wantType {
			t.Errorf("%v: body %s", tt.api, sh.body(e, nil))
		}
		ev := string(sh.event(nil, e, 7))
		if !strings.HasPrefix(ev, tt.event) || !strings.HasSuffix(ev, "\n\n") || !strings.Contains(ev, CodeRetriesExhausted) {
			t.Errorf("%v: event %q", tt.api, ev)
		}
	}
	if got := string(shapeOf(policy.APIResponses).event(nil, e, 7)); !strings.Contains(got, `"sequence_number":7`) {
		t.Errorf("the Responses event lacks its sequence number: %s", got)
	}
	a := gjson.ParseBytes(shapeOf(policy.APIAnthropic).body(e, []byte("req-1")))
	if a.Get("type").Str != "error" || a.Get("request_id").Str != "req-1" || a.Get("error.message").Str != e.msg {
		t.Errorf("the Anthropic body: %s", a.Raw)
	}
	for _, s := range errorTable {
		if s.anthropic == "" {
			t.Errorf("%s has no Anthropic error type", s.code)
		}
	}
}

// TestEveryErrorOnTheMessagesAPIIsAnthropicShaped: Sturdy's own errors
// on /v1/messages — those written before routing too — are in Anthropic's
// shape, with the table's error type and the request id. Before, 401,
// 400, 408 and 431 came back OpenAI-shaped (sturdy_error, no request_id).
func TestEveryErrorOnTheMessagesAPIIsAnthropicShaped(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.AuthKeys = []string{"sk-sturdy-0123456789"}
		o.Server.ReadTimeout = 300 * time.Millisecond
	})
	body := `{"model":"m","max_tokens":5,"messages":[]}`
	cl := "Content-Length: " + strconv.Itoa(len(body)) + "\r\n"
	for _, tt := range []struct {
		name, raw, code string
	}{
		{"401", "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: wrong\r\n" + cl + "\r\n" + body, CodeInvalidAPIKey},
		{"400 a fragment", "POST /v1/messages#x HTTP/1.1\r\nHost: x\r\n" + cl + "\r\n" + body, CodeBadRequest},
		{"400 both framings", "POST /v1/messages HTTP/1.1\r\nHost: x\r\n" + cl + "Transfer-Encoding: chunked\r\n\r\n" + body, CodeBadRequest},
		{"408", "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 999\r\n\r\n{", CodeRequestTimeout},
		{"431", "POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n", CodeHeadersTooLarge},
		{"404", "POST /v1/messages/nothing HTTP/1.1\r\nHost: x\r\nx-api-key: sk-sturdy-0123456789\r\n" + cl + "\r\n" + body, ""},
	} {
		resp, b := h.raw(tt.raw)
		var got struct {
			Type  string `json:"type"`
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
			RequestID string `json:"request_id"`
			Sturdy    struct {
				Code string `json:"code"`
			} `json:"sturdy"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %d %q", tt.name, resp.StatusCode, b)
		}
		if tt.code == "" { // the upstream's answer, passed through
			continue
		}
		if got.Type != "error" || got.Error.Type != specOf(tt.code).anthropic || got.RequestID == "" || got.Sturdy.Code != tt.code {
			t.Errorf("%s: %d %s, want Anthropic's shape with %s", tt.name, resp.StatusCode, b, specOf(tt.code).anthropic)
		}
	}
}

// TestEveryErrorRowRendersInEveryAPIsShape: each row of errorTable, in
// each API's shape — Anthropic's on the Messages API, OpenAI's elsewhere
// — with the row's code and status, its Anthropic type, the request id
// and x-should-retry as the row says.
func TestEveryErrorRowRendersInEveryAPIsShape(t *testing.T) {
	t.Parallel()
	for _, spec := range errorTable {
		if spec.status == 0 {
			continue // sent inside a stream (TestStreamErrorEvents)
		}
		for api := policy.APIOther; api <= policy.APIAnthropic; api++ {
			e := &apiError{spec: spec, msg: "m"}
			var r fasthttp.Response
			e.writeTo(&r, []byte("req-1"), api)
			b := r.Body()
			if r.StatusCode() != spec.status || string(r.Header.Peek("X-Request-Id")) != "req-1" ||
				(string(r.Header.Peek("X-Should-Retry")) == "false") == spec.sdkRetries {
				t.Errorf("%s, api %d: %d %v", spec.code, api, r.StatusCode(), r.Header.String())
			}
			if api == policy.APIAnthropic {
				if gjson.GetBytes(b, "type").Str != "error" || gjson.GetBytes(b, "error.type").Str != spec.anthropic ||
					gjson.GetBytes(b, "request_id").Str != "req-1" || gjson.GetBytes(b, "sturdy.code").Str != spec.code {
					t.Errorf("%s on the Messages API: %s", spec.code, b)
				}
				continue
			}
			if gjson.GetBytes(b, "error.type").Str != ErrorType || gjson.GetBytes(b, "error.code").Str != spec.code {
				t.Errorf("%s, api %d: %s", spec.code, api, b)
			}
		}
	}
}
