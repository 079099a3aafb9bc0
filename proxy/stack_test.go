//go:build !race

package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// stackProbe names the child process of TestARequestRunsIn8KiBOfStack.
const stackProbe = "STURDY_STACK_PROBE"

// TestARequestRunsIn8KiBOfStack: a request runs in 8 KiB of stack — one
// whose attempt dials a new upstream connection, plain and over TLS, a
// stream of each API whose first events are judged before it commits
// (chat, Responses, Messages), and a stream rescued by a continuation on
// a fallback (judged again, under the stream's Read). The client
// connection's goroutine keeps its stack for the connection's life, so
// one that grew to 16 KiB costs every idle connection, and every open
// stream, 8 KiB more. Run in a child process with the stack capped
// (debug.SetMaxStack), where a goroutine past it crashes with its trace:
// it fails unless that goroutine is a dial's own (a TLS handshake needs
// more; that is why the dial has a goroutine) and every case before the
// TLS one said it finished. Before the dial had a goroutine of its own
// the net package's dial overflowed the request's; before the attempt
// loop's visit and tries left the stack and a choice was read in one
// pass, judging a chat stream's first event did; before a continuation's
// visit and try did too, judging its first event did. Without -race only
// (its instrumentation widens every frame); .ci/run runs it so.
func TestARequestRunsIn8KiBOfStack(t *testing.T) {
	if os.Getenv(stackProbe) != "" {
		probeStack(t)
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestARequestRunsIn8KiBOfStack$", "-test.count=1")
	cmd.Env = append(os.Environ(), stackProbe+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		return
	}
	over, trace, found := strings.Cut(string(out), "[running]:")
	if !found || !strings.Contains(over, "stack overflow") {
		t.Fatalf("the probe failed: %v\n%s", err, firstLines(string(out), 60))
	}
	if _, by, _ := strings.Cut(trace, "created by"); !strings.HasPrefix(strings.TrimSpace(by), "sturdy/upstream.(*Endpoint).dial") {
		t.Fatalf("a goroutine outgrew 8 KiB of stack:%s", firstLines(trace, 80))
	}
	for _, c := range stackCases {
		if !c.tls && !strings.Contains(over, stackDone+c.name+"\n") {
			t.Fatalf("the probe ended before %q finished:\n%s", c.name, firstLines(string(out), 60))
		}
	}
}

// stackDone starts the line the probe writes as a case finishes.
const stackDone = "stack probe done: "

// stackCases are the probe's requests: to path, with body, answered by
// step (and by fallback, a fallback that continues a cut stream); tls
// last, since the handshake's own goroutine outgrows the cap and ends
// the probe there.
var stackCases = []struct {
	name, path, body string
	step, fallback   upstreamtest.Step
	tls              bool
}{
	{name: "a dial", path: "/v1/chat/completions", body: stackChat, step: upstreamtest.Step{Body: "{}"}},
	{name: "a chat stream", path: "/v1/chat/completions", body: streamChat,
		step: sseStep(roleChunk, upstreamtest.SSE("Hi", "there")[0], "data: [DONE]\n\n")},
	{name: "a Responses stream", path: "/v1/responses", body: `{"model":"m","stream":true,"input":"hi"}`,
		step: sseStep(created, inProgress, respDelta, respDone)},
	{name: "a Messages stream", path: "/v1/messages", body: msgRequest, step: sseStep(msgStart, msgPing, msgBlock, msgDelta, msgEnd)},
	{name: "a rescued stream", path: "/v1/chat/completions", body: streamChat,
		step: sseStep(append(upstreamtest.SSE("Hel", "lo")[:2], vllmError)...), fallback: continuationOf(" wor", "ld")},
	{name: "a dial over TLS", path: "/v1/chat/completions", body: stackChat, step: upstreamtest.Step{Body: "{}"}, tls: true},
}

const stackChat = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// probeStack is the child: each case is first served through a proxy of
// its own (the upstreams' goroutines grow there, and each reply closes
// its connection so the next dials), then through a fresh proxy with the
// stack capped, over a client connection opened before the cap.
func probeStack(t *testing.T) {
	cert, key := upstreamtest.SelfSigned(t)
	closing := func(st upstreamtest.Step) upstreamtest.Step {
		st.Header = append(slices.Clip(st.Header), [2]string{"Connection", "close"})
		return st
	}
	for _, c := range stackCases {
		start := upstreamtest.Start
		if c.tls {
			start = func(t testing.TB, steps ...upstreamtest.Step) *upstreamtest.Server {
				return upstreamtest.StartTLS(t, cert, key, steps...)
			}
		}
		up := start(t, closing(c.step), closing(c.step))
		opts := func(o *Options) { o.Upstreams[0].TLS = upstream.TLS{InsecureSkipVerify: true} }
		if c.fallback.Chunks != nil {
			fallback := upstreamtest.Start(t, closing(c.fallback), closing(c.fallback))
			opts = func(o *Options) {
				fb := testUpstream("fb", fallback.URL)
				fb.Continuation = upstream.ContinuePrefill
				o.Upstreams = append(o.Upstreams, fb)
				o.Routes[0].Fallbacks = []Target{{Upstream: "fb", Model: "other"}}
			}
		}
		if code := rawPost(t, startProxy(t, up.URL, opts).url, c.path, c.body, 0); code != 200 {
			t.Fatalf("%s, warming: %d", c.name, code)
		}
		if code := rawPost(t, startProxy(t, up.URL, opts).url, c.path, c.body, 8<<10); code != 200 {
			t.Fatalf("%s: %d", c.name, code)
		}
		fmt.Print(stackDone + c.name + "\n")
	}
}

// rawPost posts body to path over a connection of its own and reads the
// whole reply, with the process's stack capped at maxStack while it is
// served (0: not capped); it returns the status.
func rawPost(t *testing.T, url, path, body string, maxStack int) int {
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if maxStack > 0 {
		defer debug.SetMaxStack(debug.SetMaxStack(maxStack))
	}
	_, _ = c.Write([]byte(req))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
