//go:build external

package main

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"sturdy/internal/fakellm"
	"sturdy/internal/testdeps"
	"sturdy/internal/upstreamtest"
)

// runNode runs the e2e/node script with args (a Sturdy URL first) under
// node, once the npm package pkg of e2e/node is installed (.ci/run runs
// npm ci; a test never installs it: without node or pkg it fails when CI
// is set and skips otherwise, testdeps), and returns what it printed.
func runNode(t *testing.T, pkg, script string, args ...string) string {
	t.Helper()
	node := testdeps.Binary(t, "node", "apt-get install -y nodejs npm")
	testdeps.File(t, "e2e/node/node_modules/"+pkg, "the "+pkg+" npm SDK", "npm ci --prefix e2e/node")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, append([]string{"e2e/node/" + script}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, out)
	}
	return string(out)
}

// TestNodeClientRaisesOnAResponsesStreamCut: the Node SDK raises on
// Sturdy's Responses error event (it goes by the event's type).
func TestNodeClientRaisesOnAResponsesStreamCut(t *testing.T) {
	t.Parallel()
	const (
		created = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"r\",\"object\":\"response\"}}\n\n"
		delta   = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"m\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hel\",\"sequence_number\":1}\n\n"
	)
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{created, delta}, Fault: upstreamtest.Cut})
	out := runNode(t, "openai", "responses_stream.mjs", startSturdy(t, e2eConfig, up.URL))
	t.Logf("node said:\n%s", out)
	if !strings.Contains(out, "TEXT Hel\n") || !strings.Contains(out, "ERROR") || !strings.Contains(out, "output so far is incomplete") {
		t.Fatalf("the Node SDK did not raise on the interrupted stream:\n%s", out)
	}
}

// TestNodeStreamHelperFinishesOnTheFakeServer: the fake model server's
// Responses stream announces its output item and content part, so the
// Node SDK's stream helper (which fails "missing output at index 0"
// without them) builds the final response through Sturdy.
func TestNodeStreamHelperFinishesOnTheFakeServer(t *testing.T) {
	t.Parallel()
	fake, err := fakellm.Start("127.0.0.1:0", fakellm.Profile{Tokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	out := runNode(t, "openai", "responses_final.mjs", startSturdy(t, e2eConfig, fake.URL))
	if want := "DELTAS Sturdy keeps agents running\nTEXT Sturdy keeps agents running\n"; out != want {
		t.Fatalf("the Node SDK's stream helper said:\n%s\nwant:\n%s", out, want)
	}
}

// TestAResponsesStreamCutAfterItsAnnouncementsIsRetried: an empty output
// item and content part announced are not output, so a stream cut right
// after them is retried whole, and the client sees one clean answer.
func TestAResponsesStreamCutAfterItsAnnouncementsIsRetried(t *testing.T) {
	t.Parallel()
	fake, err := fakellm.Start("127.0.0.1:0", fakellm.Profile{Tokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	resp, err := http.Post(fake.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"demo","input":"hi","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	whole, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	events := strings.SplitAfter(string(whole), "\n\n")
	if len(events) < 5 || !strings.Contains(events[3], "response.content_part.added") {
		t.Fatalf("the fake stream does not announce its item and part first:\n%s", whole)
	}
	up := upstreamtest.Start(t,
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: events[:4], Fault: upstreamtest.Cut},
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{string(whole)}})
	out := runNode(t, "openai", "responses_final.mjs", startSturdy(t, e2eConfig, up.URL))
	if want := "DELTAS Sturdy keeps agents\nTEXT Sturdy keeps agents\n"; out != want || up.Count() != 2 {
		t.Fatalf("upstream saw %d requests; the Node SDK said:\n%s\nwant:\n%s", up.Count(), out, want)
	}
}

// TestAnthropicNodeClientThroughSturdy: the npm SDK creates and streams
// through Sturdy to the fake server, gets a 529 storm absorbed, and
// raises a stream cut after its content (never a clean end) and Sturdy's
// own error with its Anthropic type.
func TestAnthropicNodeClientThroughSturdy(t *testing.T) {
	t.Parallel()
	fake, err := fakellm.Start("127.0.0.1:0", fakellm.Profile{Tokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	if out := runNode(t, "@anthropic-ai/sdk", "messages.mjs", startSturdy(t, e2eConfig, fake.URL), "both"); out != "CREATED Sturdy keeps\nSTREAMED Sturdy keeps\n" {
		t.Fatalf("through the fake server:\n%s", out)
	}
	storm := upstreamtest.Start(t, overloaded, overloaded, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: anthropicEvents})
	if out := runNode(t, "@anthropic-ai/sdk", "messages.mjs", startSturdy(t, e2eConfig, storm.URL), "stream"); out != "STREAMED Hello\n" || storm.Count() != 3 {
		t.Fatalf("a 529 storm, %d attempts:\n%s", storm.Count(), out)
	}
	cut := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: anthropicEvents[:3], Fault: upstreamtest.Cut})
	if out := runNode(t, "@anthropic-ai/sdk", "messages.mjs", startSturdy(t, e2eConfig, cut.URL), "stream"); !strings.HasPrefix(out, "ERROR - api_error ") || !strings.Contains(out, "incomplete") {
		t.Fatalf("a cut stream:\n%s", out)
	}
	gone := upstreamtest.Start(t, upstreamtest.Step{Fault: upstreamtest.Reset})
	if out := runNode(t, "@anthropic-ai/sdk", "messages.mjs", startSturdy(t, e2eConfig, gone.URL), "create"); !strings.HasPrefix(out, "ERROR 502 api_error ") || gone.Count() != 4 {
		t.Fatalf("no answer, %d attempts (want 4: Sturdy's, none of the SDK's):\n%s", gone.Count(), out)
	}
}
