package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"sturdy/internal/fakellm"
	"sturdy/internal/upstreamtest"
)

// The official Anthropic Go SDK is a reference agent: pointed at Sturdy
// (ANTHROPIC_BASE_URL's job), with its own retries left on.

func newAnthropic(sturdyURL string) anthropic.Client {
	return anthropic.NewClient(option.WithBaseURL(sturdyURL), option.WithAPIKey("sk-ant-e2e"))
}

var messageParams = anthropic.MessageNewParams{
	Model: "claude-e2e", MaxTokens: 64,
	Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
}

// messageText is the text of a message's blocks.
func messageText(m *anthropic.Message) string {
	var b strings.Builder
	for _, c := range m.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// anthropicEvents are a Messages API stream saying "Hello", in its events.
var anthropicEvents = []string{
	"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-e2e\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n",
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
}

// overloaded is Anthropic's 529.
var overloaded = upstreamtest.Step{Status: 529, Header: [][2]string{upstreamtest.JSONHeader},
	Body: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`}

// TestAnthropicClientThroughTheFakeServer: create and stream, whole and
// accumulated, through Sturdy to the fake model server's /v1/messages.
func TestAnthropicClientThroughTheFakeServer(t *testing.T) {
	t.Parallel()
	fake, err := fakellm.Start("127.0.0.1:0", fakellm.Profile{Tokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	client := newAnthropic(startSturdy(t, e2eConfig, fake.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := client.Messages.New(ctx, messageParams)
	if err != nil || messageText(m) != "Sturdy keeps agents running" || m.StopReason != "end_turn" {
		t.Fatalf("create: %v %+v", err, m)
	}
	stream := client.Messages.NewStreaming(ctx, messageParams)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil || messageText(&acc) != "Sturdy keeps agents running" {
		t.Fatalf("stream: %v, %q", err, messageText(&acc))
	}
}

// TestAnthropicClientMeetsWhatSturdyAbsorbsAndWhatItDoesNot: a 529 storm
// is absorbed (the SDK sees one answer and never retries itself); a 400 is
// raised with its own type, untouched, never retried; an upstream that
// never answers is raised as Sturdy's error in Anthropic's shape, once (no
// SDK retry multiplied); a stream cut after its content is raised, never
// a clean end.
func TestAnthropicClientMeetsWhatSturdyAbsorbsAndWhatItDoesNot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	whole := upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: anthropicEvents}

	storm := upstreamtest.Start(t, overloaded, overloaded, overloaded, whole)
	client := newAnthropic(startSturdy(t, e2eConfig, storm.URL))
	stream := client.Messages.NewStreaming(ctx, messageParams)
	var acc anthropic.Message
	for stream.Next() {
		_ = acc.Accumulate(stream.Current())
	}
	if err := stream.Err(); err != nil || messageText(&acc) != "Hello" || storm.Count() != 4 {
		t.Fatalf("a 529 storm: %v, %q after %d attempts", err, messageText(&acc), storm.Count())
	}
	if got := retryCounts(storm); strings.Join(got, ",") != "0,0,0,0" {
		t.Fatalf("X-Stainless-Retry-Count upstream: %v", got)
	}

	bad := upstreamtest.Start(t, upstreamtest.Step{Status: 400, Header: [][2]string{upstreamtest.JSONHeader},
		Body: `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: must be positive"}}`})
	client = newAnthropic(startSturdy(t, e2eConfig, bad.URL))
	_, err := client.Messages.New(ctx, messageParams)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Type() != "invalid_request_error" || ae.Message != "max_tokens: must be positive" || bad.Count() != 1 {
		t.Fatalf("a 400: %v after %d attempts", err, bad.Count())
	}

	gone := upstreamtest.Start(t, upstreamtest.Step{Fault: upstreamtest.Reset})
	client = newAnthropic(startSturdy(t, e2eConfig, gone.URL))
	_, err = client.Messages.New(ctx, messageParams)
	if !errors.As(err, &ae) || ae.StatusCode != 502 || ae.Type() != "api_error" || !strings.Contains(ae.Message, "retry later") || gone.Count() != 4 {
		t.Fatalf("no answer: %v after %d attempts (want 4: Sturdy's, none of the SDK's)", err, gone.Count())
	}

	cut := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: anthropicEvents[:3], Fault: upstreamtest.Cut})
	client = newAnthropic(startSturdy(t, e2eConfig, cut.URL))
	stream = client.Messages.NewStreaming(ctx, messageParams)
	acc = anthropic.Message{}
	for stream.Next() {
		_ = acc.Accumulate(stream.Current())
	}
	if err := stream.Err(); !errors.As(err, &ae) || ae.Type() != "api_error" || !strings.Contains(ae.Message, "incomplete") || messageText(&acc) != "Hello" {
		t.Fatalf("a cut stream: %v after %q", err, messageText(&acc))
	}
}

// TestAnthropicClientGetsARescuedStreamWhole: a stream cut mid-text is
// continued on a fallback that honours prefill; the SDK accumulates one
// message — the first stream's id, the text whole, one stop, the output
// tokens of both attempts — and raises nothing.
func TestAnthropicClientGetsARescuedStreamWhole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hel := strings.Replace(anthropicEvents[2], `"Hello"`, `"Hel"`, 1)
	cut := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{anthropicEvents[0], anthropicEvents[1], hel},
		Fault: upstreamtest.Cut})
	cont := append([]string{strings.Replace(anthropicEvents[0], "msg_1", "msg_2", 1), anthropicEvents[1],
		strings.Replace(anthropicEvents[2], `"Hello"`, `"lo"`, 1)}, anthropicEvents[3:]...)
	fallback := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: cont})
	yaml := strings.Replace(e2eConfig, "routes:", "  - name: continuer\n    url: "+fallback.URL+"\n    continuation: prefill\nroutes:", 1) +
		"    fallbacks: [{upstream: continuer}]\n"
	client := newAnthropic(startSturdy(t, yaml, cut.URL))
	stream := client.Messages.NewStreaming(ctx, messageParams)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil || messageText(&acc) != "Hello" || acc.ID != "msg_1" || len(acc.Content) != 1 ||
		acc.StopReason != anthropic.StopReasonEndTurn || acc.Usage.OutputTokens != 3 {
		t.Fatalf("a rescued stream: %v, %q (id %s, %d blocks, stop %q, %d output tokens)", err, messageText(&acc), acc.ID,
			len(acc.Content), acc.StopReason, acc.Usage.OutputTokens)
	}
	if reqs := fallback.Requests(); len(reqs) != 1 || !strings.Contains(string(reqs[0].Body), `{"role":"assistant","content":"Hel"}`) {
		t.Fatalf("the continuation: %d requests %v", len(reqs), reqs)
	}
}

// TestAPIsFromTheConfig: `apis` in YAML reaches the proxy — an
// Anthropic-only upstream is not sent a chat completion.
func TestAPIsFromTheConfig(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	url := startSturdy(t, "upstreams:\n  - {name: claude, url: UPSTREAM, apis: [anthropic]}\n", up.URL)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 || up.Count() != 0 {
		t.Fatalf("a chat completion to an Anthropic-only upstream: %d, upstream saw %d", resp.StatusCode, up.Count())
	}
}
