package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// scriptedUpstream answers every request on 127.0.0.1 with reply, written
// in one piece, and counts the connections it accepted. A reply ending in
// "<close>" is written without it and the connection is closed.
func scriptedUpstream(t *testing.T, reply string) (addr string, conns *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	conns = new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for range 100 {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					body, closing := strings.CutSuffix(reply, "<close>")
					if _, err := io.WriteString(c, body); err != nil || closing {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), conns
}

// TestUpstreamTransportReadsBodies: a small body of known length is read
// with the head (no stream, the connection pooled at once); any other body
// streams, and its connection is pooled only when it was read to its end
// on a keep-alive connection.
func TestUpstreamTransportReadsBodies(t *testing.T) {
	big := strings.Repeat("x", headSize+1)
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
		{name: "larger than the head, streamed", reply: "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big,
			want: big, stream: true, reused: true},
		{name: "chunked with a trailer", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n",
			want: "abcde", stream: true, reused: true},
		{name: "close delimited", reply: "HTTP/1.1 200 OK\r\n\r\nuntil close<close>", want: "until close", stream: true},
		{name: "connection: close", reply: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", want: "ok"},
		{name: "interim 100 then the reply", reply: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
			want: "ok", reused: true},
		{name: "204 has no body", reply: "HTTP/1.1 204 No Content\r\n\r\n", reused: true},
		{name: "HEAD has no body", method: "HEAD", reply: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", reused: true},
		{name: "known length cut short", reply: "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\nshort<close>",
			want: "short", stream: true, wantErr: io.ErrUnexpectedEOF},
		{name: "chunks cut short", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab<close>",
			want: "ab", stream: true, wantErr: io.ErrUnexpectedEOF},
		{name: "malformed chunk size", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",
			stream: true, wantErr: errAny},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr, conns := scriptedUpstream(t, tt.reply)
			hc := &fasthttp.HostClient{Addr: addr, Transport: upstreamTransport{}, StreamResponseBody: true,
				MaxIdemponentCallAttempts: 1}
			for i := range 2 {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				req.SetRequestURI("http://" + addr + "/v1/x")
				if tt.method != "" {
					req.Header.SetMethod(tt.method)
				}
				if err := hc.DoTimeout(req, resp, 2*time.Second); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if got := resp.BodyStream() != nil; got != tt.stream {
					t.Fatalf("streamed %v, want %v", got, tt.stream)
				}
				var body []byte
				var err error
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
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
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

// errAny stands for any error in TestUpstreamTransportReadsBodies.
var errAny = errors.New("any error")

// TestChunksThatArriveTogetherAreReadTogether: one Read of a chunked body
// takes every chunk already received (and the body's end) without waiting
// for more, so a burst of stream events leaves in one write.
func TestChunksThatArriveTogetherAreReadTogether(t *testing.T) {
	addr, _ := scriptedUpstream(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"7\r\ndata: a\r\n7\r\ndata: b\r\n7\r\ndata: c\r\n0\r\n\r\n")
	hc := &fasthttp.HostClient{Addr: addr, Transport: upstreamTransport{}, StreamResponseBody: true}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/v1/x")
	if err := hc.DoTimeout(req, resp, 2*time.Second); err != nil {
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
// while a Read waits for bytes unblocks it and drops the connection.
func TestClosingABodyMidReadInterruptsIt(t *testing.T) {
	addr, conns := scriptedUpstream(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n")
	hc := &fasthttp.HostClient{Addr: addr, Transport: upstreamTransport{}, StreamResponseBody: true}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/v1/x")
	if err := hc.DoTimeout(req, resp, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	body := resp.BodyStream()
	read := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := body.Read(buf); err != nil {
				read <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond) // the reader waits for the next chunk
	_ = resp.CloseBodyStream()
	select {
	case err := <-read:
		if err == nil || err == io.EOF {
			t.Fatalf("read ended with %v, want an error", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the Read in flight was not interrupted")
	}
	if hc.ConnsCount() != 0 || conns.Load() != 1 {
		t.Fatalf("%d connections open, %d accepted; want the one closed", hc.ConnsCount(), conns.Load())
	}
}
