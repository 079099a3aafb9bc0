package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"sturdy/internal/upstreamtest"
)

// TestOpenAIClientStreamsUnderATokenBudget: the SDK's stream under a
// budget reads as it would without one — the usage chunk Sturdy asked
// for never reaches it — and the budget, settled to that usage, refuses
// the next request with a 429 the SDK does not retry.
func TestOpenAIClientStreamsUnderATokenBudget(t *testing.T) {
	t.Parallel()
	chunks := []string{
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"}}],"usage":null}` + "\n\n",
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" world"},"finish_reason":"stop"}],"usage":null}` + "\n\n",
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":20,"total_tokens":40}}` + "\n\n",
		"data: [DONE]\n\n",
	}
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: chunks})
	client := newClient(startSturdy(t, e2eConfig+"clients:\n  - tokens_per_minute: 50\n", up.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := client.Chat.Completions.NewStreaming(ctx, chatParams)
	var text strings.Builder
	for stream.Next() {
		c := stream.Current()
		if len(c.Choices) == 0 || c.Usage.TotalTokens != 0 {
			t.Fatalf("the client got a usage chunk it did not ask for: %s", c.RawJSON())
		}
		text.WriteString(c.Choices[0].Delta.Content)
	}
	if err := stream.Err(); err != nil || text.String() != "Hello world" {
		t.Fatalf("streamed %q, %v", text.String(), err)
	}
	if !strings.Contains(string(up.Requests()[0].Body), `"include_usage":true`) {
		t.Fatalf("upstream got %s", up.Requests()[0].Body)
	}
	params := chatParams
	params.MaxTokens = openai.Int(40) // 40 spent + 13 reserved (1 + a quarter of the budget) > 50
	_, err := client.Chat.Completions.New(ctx, params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Code != "rate_limited" {
		t.Fatalf("over the budget: %v", err)
	}
	if up.Count() != 1 {
		t.Fatalf("upstream saw %d requests; the SDK retried a refusal", up.Count())
	}
}
