// Package upstreamtest is a scripted model server for Sturdy's tests: a
// real fasthttp server on 127.0.0.1:0 that answers each request with the
// next step of a script (status, headers, body, streamed chunks with
// delays, or a transport fault) and records every request it receives;
// and, for servers that misbehave below HTTP, raw ones (StartRaw, and
// ServeConns, the one accept loop the tests' hand-written servers share).
package upstreamtest

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"sturdy/internal/fakellm"
)

// Fault is a transport misbehaviour of a step.
type Fault int

// The faults a step can act out.
const (
	// None answers normally.
	None Fault = iota
	// Reset closes the connection (RST) before sending any response.
	Reset
	// Hang sends nothing until the server is closed (or MaxHang passes).
	Hang
	// Cut sends the headers and Chunks, then closes the connection
	// without ending the chunked body.
	Cut
	// Stall sends the headers and Chunks, then goes silent (up to MaxHang).
	Stall
)

// MaxHang bounds how long Hang and Stall steps keep a connection silent.
const MaxHang = 20 * time.Second

// Step is one scripted answer.
type Step struct {
	// Status defaults to 200.
	Status int
	// Header holds response headers, in order, as name/value pairs.
	Header [][2]string
	// Body is sent with a Content-Length when Chunks is empty.
	Body string
	// Chunks, when set, are sent chunked, one per write with ChunkDelay
	// between them (and before the first when FirstDelay is set), on a
	// connection that closes after the reply ("Connection: close").
	Chunks     []string
	ChunkDelay time.Duration
	FirstDelay time.Duration
	// Delay waits before sending anything.
	Delay time.Duration
	// Fault acts out a transport failure.
	Fault Fault
	// SilentClose leaves "Connection: close" out of a chunked reply,
	// although the connection still closes after it: the client's next
	// request on it finds a stale keep-alive connection.
	SilentClose bool
}

// Request is what the upstream saw of one request.
type Request struct {
	Method     string
	RequestURI string
	Host       string
	Header     map[string]string // canonical names
	Raw        string            // the header lines as received
	Body       []byte
	At         time.Time
}

// Server is a running scripted upstream.
type Server struct {
	// URL is http://127.0.0.1:port.
	URL string
	// Addr is 127.0.0.1:port.
	Addr string

	srv     *fasthttp.Server
	ln      net.Listener
	release chan struct{}
	closed  sync.Once

	mu          sync.Mutex
	script      []Step
	requests    []Request
	writeErrors int
}

// Start runs a scripted upstream until the test ends. Requests get the
// steps in order; the last step repeats.
func Start(t testing.TB, steps ...Step) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{ln: ln, Addr: ln.Addr().String(), URL: "http://" + ln.Addr().String(),
		release: make(chan struct{}), script: steps}
	s.srv = &fasthttp.Server{
		Handler:               s.handle,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		Logger:                Quiet{},
		CloseOnShutdown:       true,
	}
	go func() { _ = s.srv.Serve(ln) }()
	t.Cleanup(s.Close)
	return s
}

// Quiet is a fasthttp.Logger that drops everything: test servers' noise.
type Quiet struct{}

// Printf drops the message.
func (Quiet) Printf(string, ...any) {}

// Close stops the server and releases hanging steps.
func (s *Server) Close() {
	s.closed.Do(func() {
		close(s.release)
		_ = s.srv.Shutdown()
	})
}

// SetScript replaces the remaining script.
func (s *Server) SetScript(steps ...Step) {
	s.mu.Lock()
	s.script = steps
	s.mu.Unlock()
}

// Requests returns a copy of the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Count returns the number of requests received so far.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

// WriteErrors returns how many streamed chunk writes failed because the
// other side closed the connection.
func (s *Server) WriteErrors() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeErrors
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	r := Request{Method: string(ctx.Method()), RequestURI: string(ctx.Request.Header.RequestURI()),
		Host: string(ctx.Host()), Header: map[string]string{}, Raw: string(ctx.Request.Header.RawHeaders()), Body: append([]byte(nil), ctx.Request.Body()...), At: time.Now()}
	for k, v := range ctx.Request.Header.All() {
		r.Header[string(k)] = string(v)
	}
	s.mu.Lock()
	s.requests = append(s.requests, r)
	var step Step
	if len(s.script) > 0 {
		step = s.script[0]
		if len(s.script) > 1 {
			s.script = s.script[1:]
		}
	}
	s.mu.Unlock()

	if step.Delay > 0 && !s.sleep(step.Delay) {
		return
	}
	status := step.Status
	if status == 0 {
		status = 200
	}
	switch {
	case step.Fault == Reset:
		fakellm.ResetBeforeResponse(ctx)
	case step.Fault == Hang:
		s.sleep(MaxHang)
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) { _ = c.Close() })
	case len(step.Chunks) > 0 || step.Fault == Cut || step.Fault == Stall:
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) { s.writeChunked(c, status, step) })
	default:
		ctx.SetStatusCode(status)
		for _, h := range step.Header {
			ctx.Response.Header.Add(h[0], h[1])
		}
		ctx.SetBodyString(step.Body)
	}
}

// writeChunked writes a raw HTTP/1.1 chunked response, one write (and
// flush) per chunk, then ends it as the step's fault says.
func (s *Server) writeChunked(c net.Conn, status int, step Step) {
	defer c.Close()
	w := bufio.NewWriter(c)
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\n", status, fasthttp.StatusMessage(status))
	for _, h := range step.Header {
		fmt.Fprintf(w, "%s: %s\r\n", h[0], h[1])
	}
	if !step.SilentClose {
		fmt.Fprintf(w, "Connection: close\r\n")
	}
	fmt.Fprintf(w, "Transfer-Encoding: chunked\r\n\r\n")
	if err := w.Flush(); err != nil {
		return
	}
	if step.FirstDelay > 0 && !s.sleep(step.FirstDelay) {
		return
	}
	for i, chunk := range step.Chunks {
		if i > 0 && step.ChunkDelay > 0 && !s.sleep(step.ChunkDelay) {
			return
		}
		fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk)
		if err := w.Flush(); err != nil {
			s.mu.Lock()
			s.writeErrors++
			s.mu.Unlock()
			return
		}
	}
	switch step.Fault {
	case Cut:
		fakellm.ResetConn(c) // the deferred Close is then a no-op
		return
	case Stall:
		s.sleep(MaxHang)
		return
	}
	w.WriteString("0\r\n\r\n")
	_ = w.Flush()
	// Keep reading until the proxy closes, so a write error after the
	// stream can be told apart from a normal end.
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, _ = c.Read(make([]byte, 1))
}

// sleep waits d or until the server closes; false if it closed.
func (s *Server) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.release:
		return false
	}
}

// SSE builds the chunks of an OpenAI chat.completion.chunk stream that
// says words, one word per chunk, then [DONE].
func SSE(words ...string) []string {
	var out []string
	for _, w := range words {
		out = append(out, fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`+"\n\n", w))
	}
	out = append(out, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n")
	return out
}

// Words returns n copies of w, for long SSE streams.
func Words(n int, w string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = w
	}
	return out
}

// ServeWith runs serve on a fresh 127.0.0.1 listener until the test ends,
// then calls stop (it must make serve return); it returns the http:// URL.
func ServeWith(t testing.TB, serve func(net.Listener) error, stop func()) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = serve(ln) }()
	t.Cleanup(stop)
	return "http://" + ln.Addr().String()
}

// Serve runs srv on a fresh 127.0.0.1 port until the test ends and returns
// its http:// URL.
func Serve(t testing.TB, srv *fasthttp.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// SelfSigned makes a throwaway CA-less certificate for 127.0.0.1 and
// localhost, valid for an hour, as PEM.
func SelfSigned(t testing.TB) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "sturdy-test"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// StartTLS is Start over HTTPS with the given certificate; the URL is
// https://127.0.0.1:port.
func StartTLS(t testing.TB, certPEM, keyPEM []byte, steps ...Step) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{ln: ln, Addr: ln.Addr().String(), URL: "https://" + ln.Addr().String(),
		release: make(chan struct{}), script: steps}
	s.srv = &fasthttp.Server{Handler: s.handle, NoDefaultServerHeader: true, NoDefaultDate: true,
		NoDefaultContentType: true, Logger: Quiet{}, CloseOnShutdown: true}
	go func() { _ = s.srv.ServeTLSEmbed(ln, certPEM, keyPEM) }()
	t.Cleanup(s.Close)
	return s
}

// Get fetches url and returns the status and body.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// LogBuffer collects log output from concurrent writers.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ChatCompletion is a minimal OpenAI chat.completion JSON body saying text.
func ChatCompletion(text string) string {
	return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, text)
}

// JSONHeader is a Content-Type: application/json header pair.
var JSONHeader = [2]string{"Content-Type", "application/json"}

// SSEHeader is a Content-Type: text/event-stream header pair.
var SSEHeader = [2]string{"Content-Type", "text/event-stream"}

// StartRaw runs an upstream on 127.0.0.1:0 that reads one request per
// connection, writes the next of replies byte for byte (the last one
// repeats) and closes the connection: an HTTP/1.0 server, or any framing
// a test needs. It returns the http:// URL.
func StartRaw(t testing.TB, replies ...string) string {
	t.Helper()
	var mu sync.Mutex
	return "http://" + ServeConns(t, func(c net.Conn) {
		mu.Lock()
		reply := replies[0]
		if len(replies) > 1 {
			replies = replies[1:]
		}
		mu.Unlock()
		_ = c.SetDeadline(time.Now().Add(MaxHang))
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			_, _ = io.WriteString(c, reply)
		}
	})
}

// ServeConns accepts connections on a free 127.0.0.1 port until the test
// ends, handing each to handle on a goroutine of its own (and closing it
// when handle returns); it returns the address (host:port). For servers
// that misbehave below HTTP: a reply written raw, cut, paused or gated.
func ServeConns(t testing.TB, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// RaiseParallel parses the test flags and, unless -parallel was given,
// runs at least atLeast parallel tests at once (GOMAXPROCS, the default,
// where that is more): for a TestMain whose tests mostly wait — on the
// servers, binaries, timeouts and paced streams they are about — rather
// than compute, so GOMAXPROCS alone would leave a small machine idle.
func RaiseParallel(atLeast int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(atLeast, runtime.GOMAXPROCS(0))))
	}
}
