package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/rs/zerolog"

	"sturdy/config"
	"sturdy/internal/fakellm"
	"sturdy/internal/upstreamtest"
	"sturdy/proxy"
)

// startSturdy runs Sturdy from YAML (upstream URL substituted for
// UPSTREAM) on 127.0.0.1:0 and returns its base URL.
func startSturdy(t *testing.T, yaml, upstreamURL string) string {
	t.Helper()
	cfg, err := config.Parse("e2e.yaml", []byte(strings.ReplaceAll(yaml, "UPSTREAM", upstreamURL)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(proxyOptions(cfg, zerolog.Nop(), nil))
	if err != nil {
		t.Fatal(err)
	}
	return upstreamtest.ServeWith(t, p.Serve, func() { _ = p.Shutdown(context.Background()) })
}

const e2eConfig = `
upstreams:
  - name: flaky
    url: UPSTREAM
    timeouts: {connect: 500ms, first_byte: 2s, idle: 1s}
routes:
  - name: default
    upstream: flaky
    retry: {max_attempts: 4, base_delay: 1ms, max_delay: 5ms}
`

// newClient is the official OpenAI Go SDK pointed at Sturdy, with its
// default retry behaviour left on.
func newClient(sturdyURL string) openai.Client {
	return openai.NewClient(option.WithBaseURL(sturdyURL+"/v1/"), option.WithAPIKey("sk-e2e"))
}

var chatParams = openai.ChatCompletionNewParams{
	Model:    "m",
	Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
}

// retryCounts lists X-Stainless-Retry-Count of every request the upstream saw.
func retryCounts(up *upstreamtest.Server) []string {
	var out []string
	for _, r := range up.Requests() {
		out = append(out, r.Header["X-Stainless-Retry-Count"])
	}
	return out
}

func TestOpenAIClientSucceedsThroughFlakyUpstream(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t,
		upstreamtest.Step{Status: 503, Body: `{"error":{"message":"overloaded"}}`},
		upstreamtest.Step{Fault: upstreamtest.Reset},
		upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After-Ms", "50"}}},
		upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader}, Body: upstreamtest.ChatCompletion("Hello from the model")})
	client := newClient(startSturdy(t, e2eConfig, up.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := client.Chat.Completions.New(ctx, chatParams)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Choices[0].Message.Content; got != "Hello from the model" {
		t.Fatalf("content %q", got)
	}
	if got := retryCounts(up); strings.Join(got, ",") != "0,0,0,0" {
		t.Fatalf("upstream saw X-Stainless-Retry-Count %v; Sturdy's retries must be invisible to the SDK", got)
	}
}

func TestOpenAIClientStreamsThroughFlakyUpstream(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t,
		upstreamtest.Step{Status: 502},
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Fault: upstreamtest.Cut},
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: upstreamtest.SSE("Hello", " ", "world"),
			ChunkDelay: 10 * time.Millisecond})
	client := newClient(startSturdy(t, e2eConfig, up.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := client.Chat.Completions.NewStreaming(ctx, chatParams)
	var text strings.Builder
	for stream.Next() {
		if ch := stream.Current().Choices; len(ch) > 0 {
			text.WriteString(ch[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != "Hello world" {
		t.Fatalf("streamed %q", text.String())
	}
	if got := retryCounts(up); strings.Join(got, ",") != "0,0,0" {
		t.Fatalf("X-Stainless-Retry-Count %v", got)
	}
}

func TestOpenAIClientDoesNotRetryAfterSturdyGaveUp(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 500, Header: [][2]string{upstreamtest.JSONHeader},
		Body: `{"error":{"message":"model crashed","type":"server_error","code":null}}`})
	client := newClient(startSturdy(t, e2eConfig, up.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := client.Chat.Completions.New(ctx, chatParams)
	var apiErr *openai.Error
	if err == nil || !errors.As(err, &apiErr) || apiErr.StatusCode != 500 {
		t.Fatalf("err = %v, want the upstream's 500", err)
	}
	// Sturdy made max_attempts = 4; the SDK (2 retries by default) added none.
	if got := retryCounts(up); strings.Join(got, ",") != "0,0,0,0" {
		t.Fatalf("upstream saw %d requests with retry counts %v; the SDK retried after Sturdy gave up", len(got), got)
	}
}

func TestOpenAIClientSeesInterruptedStreamAsError(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE("partial")[:1], Fault: upstreamtest.Cut})
	client := newClient(startSturdy(t, e2eConfig, up.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := client.Chat.Completions.NewStreaming(ctx, chatParams)
	for stream.Next() {
	}
	t.Logf("stream error: %v", stream.Err())
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), `"code":"stream_interrupted"`) {
		t.Fatalf("stream.Err() = %v, want the stream_interrupted error", err)
	}
}

// TestOpenAIClientThroughAnHTTP10Upstream: an HTTP/1.0 upstream streams
// close-delimited; the SDK gets a proper HTTP/1.1 chunked stream — whole
// when it ended with [DONE], an error when the connection closed first.
func TestOpenAIClientThroughAnHTTP10Upstream(t *testing.T) {
	t.Parallel()
	const head = "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
	chunk := func(s string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` + s + `"}}]}` + "\n\n"
	}
	for _, tt := range []struct {
		name, body string
		wantErr    bool
	}{
		{"whole", chunk("Hello") + chunk(" world") + "data: [DONE]\n\n", false},
		{"closed before [DONE]", chunk("Hello") + chunk(" wor"), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := newClient(startSturdy(t, e2eConfig, upstreamtest.StartRaw(t, head+tt.body)))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream := client.Chat.Completions.NewStreaming(ctx, chatParams)
			var text strings.Builder
			for stream.Next() {
				if ch := stream.Current().Choices; len(ch) > 0 {
					text.WriteString(ch[0].Delta.Content)
				}
			}
			err := stream.Err()
			switch {
			case tt.wantErr && (err == nil || !strings.Contains(err.Error(), "stream_interrupted")):
				t.Fatalf("a cut stream read as %q with err %v", text.String(), err)
			case !tt.wantErr && (err != nil || text.String() != "Hello world"):
				t.Fatalf("streamed %q, err %v", text.String(), err)
			}
		})
	}
}

// TestOpenAIClientRaisesOnAResponsesStreamCut: a Responses API stream cut
// after its first output ends with Sturdy's error event, which openai-go
// raises; one that failed in its framing was retried invisibly.
func TestOpenAIClientRaisesOnAResponsesStreamCut(t *testing.T) {
	t.Parallel()
	const (
		created = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"r\",\"object\":\"response\"}}\n\n"
		failed  = "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"boom\",\"param\":null,\"sequence_number\":1}\n\n"
		delta   = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"m\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hel\",\"sequence_number\":1}\n\n"
	)
	up := upstreamtest.Start(t,
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{created, failed}},
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{created, delta}, Fault: upstreamtest.Cut})
	client := newClient(startSturdy(t, e2eConfig, up.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	var text strings.Builder
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "stream_interrupted") || text.String() != "Hel" {
		t.Fatalf("streamed %q, err %v; want the text so far and the stream_interrupted error", text.String(), err)
	}
	if up.Count() != 2 {
		t.Fatalf("upstream saw %d requests: the failed framing was not retried", up.Count())
	}
}

// TestOpenAIClientReadsARescuedStreamAsOne: a stream cut mid-answer and
// continued on a fallback reads, through openai-go's accumulator, as one
// normal stream: one id, the whole text, one finish_reason, the
// continuation's usage.
func TestOpenAIClientReadsARescuedStreamAsOne(t *testing.T) {
	t.Parallel()
	chunk := func(id, delta, finish string) string {
		f := "null"
		if finish != "" {
			f = `"` + finish + `"`
		}
		return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` +
			delta + `,"finish_reason":` + f + `}]}` + "\n\n"
	}
	primary := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Fault: upstreamtest.Cut,
		Chunks: []string{chunk("chatcmpl-a", `{"role":"assistant","content":""}`, ""), chunk("chatcmpl-a", `{"content":"The answer"}`, ""),
			chunk("chatcmpl-a", `{"content":" is"}`, "")}})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{
		chunk("chatcmpl-b", `{"role":"assistant","content":""}`, ""), chunk("chatcmpl-b", `{"content":" 42."}`, ""),
		chunk("chatcmpl-b", `{}`, "stop"),
		`data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}` + "\n\n",
		"data: [DONE]\n\n"}})
	yaml := strings.ReplaceAll(`
upstreams:
  - {name: primary, url: UPSTREAM, timeouts: {idle: 1s}}
  - {name: fallback, url: FALLBACK, continuation: prefill}
routes:
  - {name: default, upstream: primary, fallbacks: [{upstream: fallback}], retry: {base_delay: 1ms, max_delay: 5ms}}
`, "FALLBACK", fallback.URL)
	client := newClient(startSturdy(t, yaml, primary.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	params := chatParams
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	finishes := 0
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		if len(ch.Choices) > 0 && ch.Choices[0].FinishReason != "" {
			finishes++
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.ID != "chatcmpl-a" || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "The answer is 42." ||
		acc.Choices[0].FinishReason != "stop" || finishes != 1 || acc.Usage.TotalTokens != 12 {
		t.Fatalf("accumulated %+v (finish reasons: %d)", acc.ChatCompletion, finishes)
	}
	if fallback.Count() != 1 {
		t.Fatalf("the fallback saw %d requests", fallback.Count())
	}
}

// TestAPoolOfFakeReplicasIsHealthChecked: the fake server answers the
// health path docs/pools.md recommends (it used to 404, taking a whole pool
// of fake replicas out), and in its outage fails it, so the health checks
// take that replica out and every request goes to the other.
func TestAPoolOfFakeReplicasIsHealthChecked(t *testing.T) {
	t.Parallel()
	up, err := fakellm.Start("127.0.0.1:0", fakellm.Profile{Tokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	down, err := fakellm.Start("127.0.0.1:0", fakellm.Profile{Tokens: 2, Outage: fakellm.Outage{From: 0, To: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	url := startSturdy(t, `
upstreams:
  - name: fakes
    endpoints: [`+up.URL+`, `+down.URL+`]
    health_check: {path: /health, every: 50ms, timeout: 1s, healthy: 1, unhealthy: 1}
routes:
  - name: default
    upstream: fakes
    retry: {max_attempts: 1}
`, "")
	time.Sleep(time.Second) // twenty health rounds: the replica in its outage is out after the first
	for i := range 10 {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := down.Stats().Requests; n != 0 {
		t.Fatalf("the replica failing its health checks received %d requests", n)
	}
}
