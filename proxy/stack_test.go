//go:build !race

package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// stackProbe names the child process of TestARequestRunsIn8KiBOfStack.
const stackProbe = "STURDY_STACK_PROBE"

// TestARequestRunsIn8KiBOfStack: a request runs in 8 KiB of stack — one
// whose attempt dials a new upstream connection, plain and over TLS, and
// a stream of each API whose first events are judged before it commits
// (chat, Responses, Messages). The request's goroutine keeps its stack
// for its client connection's life, so one that grew to 16 KiB costs
// every idle connection, and every open stream, 8 KiB more. Run in a
// child process with the stack capped (debug.SetMaxStack), where a
// goroutine past it crashes with its trace; it fails if that goroutine is
// the proxy's request path (the dial's own goroutine may outgrow it: a
// TLS handshake does). Before the dial had a goroutine of its own, the net
// package's dial overflowed the request's; before the attempt loop's
// visit and tries left the request's stack and a choice was read in one
// pass, judging a chat stream's first event did. Without -race only (its
// instrumentation widens every frame); .ci/run runs it so.
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
	// The cap is the process's: the dial's own goroutine (a TLS
	// handshake needs more than 8 KiB) may be the one past it, and that
	// is where it belongs. Only the goroutine that overflowed counts.
	over, _, found := strings.Cut(string(out), "[running]:")
	if !found || !strings.Contains(over, "stack overflow") {
		t.Fatalf("the probe failed: %v\n%s", err, firstLines(string(out), 60))
	}
	_, trace, _ := strings.Cut(string(out), "[running]:")
	trace, _, _ = strings.Cut(trace, "created by")
	if strings.Contains(trace, "sturdy/proxy.(*Proxy).Handle") {
		t.Fatalf("a request's goroutine outgrew 8 KiB of stack:%s", firstLines(trace, 60))
	}
}

// probeStack is the child: each upstream is first reached through a
// proxy of its own (its server's goroutines grow there, and the reply
// closes the connection so they are reused), then through a fresh proxy
// with the stack capped, over a client connection opened before the cap.
func probeStack(t *testing.T) {
	cert, key := upstreamtest.SelfSigned(t)
	closing := func(st upstreamtest.Step) upstreamtest.Step {
		st.Header = append(st.Header, [2]string{"Connection", "close"})
		return st
	}
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range []struct {
		name, path, body string
		step             upstreamtest.Step
		tls              bool
	}{
		{"a dial", "/v1/chat/completions", chat, upstreamtest.Step{Body: "{}"}, false},
		{"a chat stream", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			sseStep(roleChunk, upstreamtest.SSE("Hi", "there")[0], "data: [DONE]\n\n"), false},
		{"a Responses stream", "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`,
			sseStep(created, inProgress, respDelta, respDone), false},
		{"a Messages stream", "/v1/messages", msgRequest, sseStep(msgStart, msgPing, msgBlock, msgDelta, msgEnd), false},
		// Last: the handshake's own goroutine outgrows the cap, which ends
		// the probe there.
		{"a dial over TLS", "/v1/chat/completions", chat, upstreamtest.Step{Body: "{}"}, true},
	} {
		start := upstreamtest.Start
		if tt.tls {
			start = func(t testing.TB, steps ...upstreamtest.Step) *upstreamtest.Server {
				return upstreamtest.StartTLS(t, cert, key, steps...)
			}
		}
		up := start(t, closing(tt.step), closing(tt.step))
		insecure := func(o *Options) { o.Upstreams[0].TLS = upstream.TLS{InsecureSkipVerify: true} }
		if code := rawPost(t, startProxy(t, up.URL, insecure).url, tt.path, tt.body, 0); code != 200 {
			t.Fatalf("%s, warming: %d", tt.name, code)
		}
		if code := rawPost(t, startProxy(t, up.URL, insecure).url, tt.path, tt.body, 8<<10); code != 200 {
			t.Fatalf("%s: %d", tt.name, code)
		}
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
