package listener

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// counts is what a Guard told its Config.
type counts struct{ opened, closed, refused atomic.Int32 }

func guarded(t *testing.T, max int64, c *counts) (*Guard, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := New(ln, Config{
		MaxConnections: max, ReduceMemoryAbove: 1 << 30, WriteTimeout: time.Second, Stopping: make(chan struct{}),
		Refusal:     func(c net.Conn) { _, _ = io.WriteString(c, "HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n") },
		AcceptError: func(string, error, bool) {},
		Opened:      func() { c.opened.Add(1) }, Closed: func() { c.closed.Add(1) }, Refused: func() { c.refused.Add(1) },
	}, nil)
	t.Cleanup(func() { _ = g.Close() })
	return g, ln.Addr().String()
}

// connected is a client's connection to a Guard and the served side of
// it, as Accept returns it; both close when the test ends.
func connected(t *testing.T) (client, served net.Conn) {
	t.Helper()
	var c counts
	g, addr := guarded(t, 10, &c)
	client, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	served, err = g.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = served.Close() })
	return client, served
}

// TestAConnectionPastTheCapIsRefusedWithTheProxysAnswer: the first
// connection is served; the second, past MaxConnections, is read and
// answered with the Refusal; closing the first frees its place.
func TestAConnectionPastTheCapIsRefusedWithTheProxysAnswer(t *testing.T) {
	t.Parallel()
	var c counts
	g, addr := guarded(t, 1, &c)
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			conn, err := g.Accept()
			if err != nil {
				return
			}
			accepted <- conn
		}
	}()
	first, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	served := <-accepted
	second, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	fmt.Fprint(second, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = second.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(second).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 503") {
		t.Fatalf("the second connection read %q, %v; want the refusal", line, err)
	}
	if c.opened.Load() != 1 || c.refused.Load() != 1 {
		t.Fatalf("opened %d, refused %d", c.opened.Load(), c.refused.Load())
	}
	_ = served.Close()
	_ = served.Close() // once only
	if c.closed.Load() != 1 || g.open.Load() != 0 {
		t.Fatalf("closed %d, open %d after closing the served connection", c.closed.Load(), g.open.Load())
	}
	third, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("a connection under the cap again was not served")
	}
}

// leaver records that it was told.
type leaver struct{ told atomic.Int32 }

func (l *leaver) Left() { l.told.Add(1) }

// TestAClientThatLeavesIsToldToItsRequest: the watcher tells the request
// a connection serves when the peer closes; a request that starts on a
// connection already left is told at once.
func TestAClientThatLeavesIsToldToItsRequest(t *testing.T) {
	t.Parallel()
	client, conn := connected(t)
	cc := ConnOf(conn)
	if cc == nil {
		t.Fatal("ConnOf found no Conn")
	}
	var r leaver
	cc.Serving(&r)
	_ = client.Close()
	if !cc.watched { // outside Linux a leaving is seen by a failed write: told by hand here
		cc.left()
	}
	for end := time.Now().Add(5 * time.Second); r.told.Load() == 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	if r.told.Load() != 1 {
		t.Fatalf("the request was told %d times", r.told.Load())
	}
	// Writes to the closed peer draw a reset: another event, not another telling.
	for range 3 {
		_, _ = conn.Write([]byte("x"))
		time.Sleep(20 * time.Millisecond)
	}
	cc.left()
	if r.told.Load() != 1 {
		t.Fatalf("the request was told %d times after more events", r.told.Load())
	}
	var late leaver
	cc.Serving(&late)
	if late.told.Load() != 1 {
		t.Fatal("a request starting on a connection already left was not told")
	}
}

// TestNotedPathIsTheLastRequestsPath: a read that begins a request notes
// its path, bounded, without query; other reads leave it.
func TestNotedPathIsTheLastRequestsPath(t *testing.T) {
	t.Parallel()
	client, conn := connected(t)
	buf := make([]byte, 4096)
	for _, tc := range []struct{ send, want string }{
		{"POST /v1/messages?beta=true HTTP/1.1\r\n\r\n", "/v1/messages"},
		{"a body's bytes, no request line", "/v1/messages"},
		{"GET /" + strings.Repeat("p", 100) + " HTTP/1.1\r\n\r\n", "/" + strings.Repeat("p", maxNotedPath-1)},
	} {
		if _, err := io.WriteString(client, tc.send); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAtLeast(conn, buf, len(tc.send)); err != nil {
			t.Fatal(err)
		}
		if got := string(NotedPath(conn)); got != tc.want {
			t.Errorf("after %.30q: noted %q, want %q", tc.send, got, tc.want)
		}
	}
}

// TestAcceptErrorsThatPass names the errors a listener survives.
func TestAcceptErrorsThatPass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		reason string
		passes bool
	}{
		{&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.EMFILE)}, "emfile", true},
		{syscall.ECONNABORTED, "econnaborted", true},
		{os.ErrDeadlineExceeded, "other", true},
		{net.ErrClosed, "", false},
		{errors.New("something else"), "", false},
	} {
		if reason, passes := AcceptErrorReason(tc.err); reason != tc.reason || passes != tc.passes {
			t.Errorf("%v: %q %v, want %q %v", tc.err, reason, passes, tc.reason, tc.passes)
		}
	}
}

// TestAHandoffTakesNothingOnceStopping: a Handoff closed or stopping
// neither takes nor gives a connection.
func TestAHandoffTakesNothingOnceStopping(t *testing.T) {
	t.Parallel()
	stopping := make(chan struct{})
	h := NewHandoff(&net.TCPAddr{}, stopping)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { _ = h.put(a) }()
	if c, err := h.Accept(); err != nil || c != a {
		t.Fatalf("Accept: %v %v", c, err)
	}
	close(stopping)
	if h.put(b) {
		t.Fatal("a stopping handoff took a connection")
	}
	if _, err := h.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept while stopping: %v", err)
	}
}
