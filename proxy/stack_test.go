//go:build !race

package proxy

import (
	"bufio"
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

// stackProbe names the child process of TestADialLeavesTheRequestsStackAlone.
const stackProbe = "STURDY_STACK_PROBE"

// TestADialLeavesTheRequestsStackAlone: a request whose attempt dials a
// new upstream connection, plain and over TLS, runs in 8 KiB of stack —
// the request's goroutine keeps its stack for its client connection's
// life, so one that grew to 16 KiB costs every idle connection 8 KiB
// more. Run in a child process with the stack capped
// (debug.SetMaxStack), where a goroutine past it crashes with its trace;
// it fails if that goroutine is the proxy's request path (the dial's own
// goroutine may outgrow it: a TLS handshake does). Before the dial had a
// goroutine of its own, the net package's dial overflowed the request's.
// Without -race only (its instrumentation widens every frame); .ci/run
// runs it so.
func TestADialLeavesTheRequestsStackAlone(t *testing.T) {
	if os.Getenv(stackProbe) != "" {
		probeStack(t)
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestADialLeavesTheRequestsStackAlone$", "-test.count=1")
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
	closing := upstreamtest.Step{Body: "{}", Header: [][2]string{{"Connection", "close"}}}
	for _, up := range []*upstreamtest.Server{upstreamtest.Start(t, closing, closing), upstreamtest.StartTLS(t, cert, key, closing, closing)} {
		insecure := func(o *Options) { o.Upstreams[0].TLS = upstream.TLS{InsecureSkipVerify: true} }
		if resp, body := startProxy(t, up.URL, insecure).chat(""); resp.StatusCode != 200 {
			t.Fatalf("warming %s: %d %s", up.URL, resp.StatusCode, body)
		}
		h := startProxy(t, up.URL, insecure)
		c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
		req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + body
		old := debug.SetMaxStack(8 << 10)
		_, _ = c.Write([]byte(req))
		resp, err := http.ReadResponse(br, nil)
		debug.SetMaxStack(old)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v", up.URL, err)
		}
		c.Close()
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
