package upstream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sturdy/internal/upstreamtest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// scriptedUpstream answers every request on 127.0.0.1 with reply and
// counts the connections it accepted. The reply is written in one piece,
// or in pieces 30 ms apart where it says "<pause>"; one ending in
// "<close>" is written without it and the connection is closed.
func scriptedUpstream(t *testing.T, reply string) (addr string, conns *atomic.Int32) {
	t.Helper()
	conns = new(atomic.Int32)
	return upstreamtest.ServeConns(t, func(c net.Conn) {
		conns.Add(1)
		br := bufio.NewReader(c)
		for range 100 {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			body, closing := strings.CutSuffix(reply, "<close>")
			for i, piece := range strings.Split(body, "<pause>") {
				if i > 0 {
					time.Sleep(30 * time.Millisecond)
				}
				if _, err := io.WriteString(c, piece); err != nil {
					return
				}
			}
			if closing {
				return
			}
		}
	}), conns
}

// TestUpstreamTransportReadsBodies: a small body of known length is read
// with the head (no stream, the connection pooled at once); any other body
// streams, and its connection is pooled only when it was read to its end
// on a keep-alive connection.
func TestUpstreamTransportReadsBodies(t *testing.T) {
	t.Parallel()
	big, fits := strings.Repeat("x", HeadSize+1), strings.Repeat("y", HeadSize)
	for _, tt := range []struct {
		name, reply, method string
		want                string
		stream              bool
		wantErr             error // from reading the body
		reused              bool  // a second request goes on the same connection
	}{
		{name: "small known length, read whole", reply: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
			want: "hello", reused: true},
		{name: "empty known length", reply: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", reused: true},
		{name: "as large as the head, read whole", reply: "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(fits)) + "\r\n\r\n" + fits,
			want: fits, reused: true},
		{name: "larger than the head, streamed", reply: "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big,
			want: big, stream: true, reused: true},
		{name: "chunked with a trailer", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n",
			want: "abcde", stream: true, reused: true},
		{name: "the last chunk in a later segment", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n<pause>0\r\n\r\n",
			want: "abc", stream: true, reused: true},
		{name: "close delimited", reply: "HTTP/1.1 200 OK\r\n\r\nuntil close<close>", want: "until close", stream: true},
		{name: "connection: close", reply: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", want: "ok"},
		{name: "interim 100 then the reply", reply: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
			want: "ok", reused: true},
		{name: "HTTP/1.0 without keep-alive", reply: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", want: "ok"},
		{name: "204 has no body", reply: "HTTP/1.1 204 No Content\r\n\r\n", reused: true},
		{name: "304 has no body", reply: "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", reused: true},
		{name: "HEAD has no body", method: "HEAD", reply: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", reused: true},
		{name: "known length cut short", reply: "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\nshort<close>",
			want: "short", stream: true, wantErr: io.ErrUnexpectedEOF},
		{name: "cut in the trailer", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n<close>",
			want: "ab", stream: true, wantErr: io.ErrUnexpectedEOF},
		{name: "chunks cut short", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab<close>",
			want: "ab", stream: true, wantErr: io.ErrUnexpectedEOF},
		{name: "malformed chunk size", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",
			stream: true, wantErr: errAny},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr, conns := scriptedUpstream(t, tt.reply)
			hc := transportClient(addr)
			for i := range 2 {
				resp, err := send(t, hc, tt.method, 2*time.Second)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if got := resp.BodyStream() != nil; got != tt.stream {
					t.Fatalf("streamed %v, want %v", got, tt.stream)
				}
				var body []byte
				if tt.stream {
					body, err = io.ReadAll(resp.BodyStream())
					_ = resp.CloseBodyStream()
				} else {
					body = resp.Body()
				}
				switch {
				case tt.wantErr == errAny && err == nil, tt.wantErr != errAny && !errors.Is(err, tt.wantErr):
					t.Fatalf("body error %v, want %v", err, tt.wantErr)
				case string(body) != tt.want:
					t.Fatalf("body %q, want %q", body, tt.want)
				}
			}
			want := int32(2)
			if tt.reused {
				want = 1
			}
			if got := conns.Load(); got != want {
				t.Fatalf("%d connections for two requests, want %d", got, want)
			}
		})
	}
}

// transportClient is a HostClient to addr that goes through
// upstreamTransport, as an endpoint's does: bodies streamed, no retries.
func transportClient(addr string) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: addr, Transport: upstreamTransport{}, StreamResponseBody: true,
		MaxIdemponentCallAttempts: 1}
}

// send sends a request for /v1/x (GET unless method says otherwise)
// through hc within timeout; its response is released when the test ends.
func send(t *testing.T, hc *fasthttp.HostClient, method string, timeout time.Duration) (*fasthttp.Response, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	t.Cleanup(func() {
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	})
	req.SetRequestURI("http://" + hc.Addr + "/v1/x")
	if method != "" {
		req.Header.SetMethod(method)
	}
	return resp, hc.DoTimeout(req, resp, timeout)
}

// errAny stands for any error in TestUpstreamTransportReadsBodies.
var errAny = errors.New("any error")

// TestChunksThatArriveTogetherAreReadTogether: one Read of a chunked body
// takes every chunk already received (and the body's end) without waiting
// for more, so a burst of stream events leaves in one write.
func TestChunksThatArriveTogetherAreReadTogether(t *testing.T) {
	t.Parallel()
	addr, _ := scriptedUpstream(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"7\r\ndata: a\r\n7\r\ndata: b\r\n7\r\ndata: c\r\n0\r\n\r\n")
	hc := transportClient(addr)
	resp, err := send(t, hc, "", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.CloseBodyStream()
	// The head and the chunks came in one write; give them a moment to be
	// buffered whole before the first Read.
	time.Sleep(20 * time.Millisecond)
	buf := make([]byte, 4096)
	n, err := resp.BodyStream().Read(buf)
	if string(buf[:n]) != "data: adata: bdata: c" || err != nil {
		t.Fatalf("first read %q, %v", buf[:n], err)
	}
	if n, err := resp.BodyStream().Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("second read %d, %v; want the end alone", n, err)
	}
}

// TestClosingABodyMidReadInterruptsIt: a Close from another goroutine
// while a Read waits for bytes unblocks that Read (its error is the
// connection's, not a closed body's) and drops the connection.
func TestClosingABodyMidReadInterruptsIt(t *testing.T) {
	t.Parallel()
	addr, conns := scriptedUpstream(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n")
	hc := transportClient(addr)
	resp, err := send(t, hc, "", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	body := resp.BodyStream()
	first, read := make(chan struct{}), make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		if n, err := body.Read(buf); n != 2 || err != nil {
			read <- fmt.Errorf("first read %d, %v", n, err)
			return
		}
		close(first)
		_, err := body.Read(buf) // waits: no more chunks come
		read <- err
	}()
	select {
	case <-first:
	case err := <-read:
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the second Read is waiting for bytes
	_ = resp.CloseBodyStream()
	select {
	case err := <-read:
		if err == nil || err == io.EOF || errors.Is(err, io.ErrClosedPipe) {
			t.Fatalf("the waiting read ended with %v, want the closed connection's error", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the Read in flight was not interrupted")
	}
	if hc.ConnsCount() != 0 || conns.Load() != 1 {
		t.Fatalf("%d connections open, %d accepted; want the one closed", hc.ConnsCount(), conns.Load())
	}
}

// TestAnUpstreamThatNeverAnswersTimesOut: the request's timeout bounds
// the wait for the head.
func TestAnUpstreamThatNeverAnswersTimesOut(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // silent until the listener closes
		}
	}()
	start := time.Now()
	_, err = send(t, transportClient(ln.Addr().String()), "", 100*time.Millisecond)
	if took := time.Since(start); !IsTimeout(err) || took > 2*time.Second {
		t.Fatalf("%v after %v, want a timeout after about 100ms", err, took)
	}
}

// TestTheWaitForAConnectionCountsAgainstTheTimeout: the request's
// timeout runs from the send, not from when a connection was free. The
// only connection is busy for 120 ms and the upstream answers 150 ms after
// each request: 270 ms in all, past the 200 ms timeout.
func TestTheWaitForAConnectionCountsAgainstTheTimeout(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("z", HeadSize+1)
	addr, _ := scriptedUpstream(t, strings.Repeat("<pause>", 5)+"HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(big))+"\r\n\r\n"+big)
	hc := transportClient(addr)
	hc.MaxConns, hc.MaxConnWaitTimeout = 1, time.Second
	resp1, err := send(t, hc, "", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pooled := make(chan struct{})
	defer func() { <-pooled }()
	go func() { // the connection is busy a while, then pooled
		defer close(pooled)
		time.Sleep(120 * time.Millisecond)
		_, _ = io.Copy(io.Discard, resp1.BodyStream())
		_ = resp1.CloseBodyStream()
	}()
	start := time.Now()
	_, err = send(t, hc, "", 200*time.Millisecond)
	if took := time.Since(start); !IsTimeout(err) || took > 2*time.Second {
		t.Fatalf("%v after %v, want a timeout: the wait counts", err, took)
	}
}

// TestAPooledConnectionIsLetGoFirst: before the transport pools a
// connection, the Hold it was given to forgets it (so a client leaving
// then cannot close it under another request); one it was given to
// earlier, now using another, keeps that one.
func TestAPooledConnectionIsLetGoFirst(t *testing.T) {
	t.Parallel()
	h := new(Hold)
	c1, c2 := new(upstreamConn), new(upstreamConn)
	h.using(c1)
	c1.detach()
	if h.conn != nil {
		t.Fatal("the hold still has the pooled connection")
	}
	h.using(c2)
	c1.user.Store(h) // a stale pointer from an earlier use
	if c1.detach() || h.conn != c2 {
		t.Fatal("letting go of an earlier connection dropped the one in use")
	}
	// The client leaves while the connection is still the request's: it
	// was closed (Sever), so it must not be pooled.
	h.severed.Store(true)
	if !c2.detach() || h.conn != nil {
		t.Fatal("a connection its gone client's request held was let go of as fit for the pool")
	}
}

func TestDiscardTrailer(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, in string
		want     error
	}{
		{"none", "\r\n", nil},
		{"fields", "Set-Cookie: a=1\r\nX-Sum: 2\r\n\r\nnext", nil},
		{"bare LF", "X: 1\n\n", nil},
		{"cut", "X: 1\r\n", io.ErrUnexpectedEOF},
		{"one long line", "X: " + strings.Repeat("x", 9<<10) + "\r\n\r\n", errTrailerTooLarge},
		{"many lines", strings.Repeat("X: 12345678\r\n", 1000) + "\r\n", errTrailerTooLarge},
	} {
		br := bufio.NewReaderSize(strings.NewReader(tt.in), 16)
		if err := discardTrailer(br); err != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}
