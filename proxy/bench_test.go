package proxy

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"sturdy/internal/upstreamtest"
)

// BenchmarkHeaderCopy measures building the upstream request's headers.
func BenchmarkHeaderCopy(b *testing.B) {
	b.ReportAllocs()
	var src, dst fasthttp.RequestHeader
	src.SetMethod("POST")
	src.SetRequestURI("/v1/chat/completions")
	for _, h := range [][2]string{{"Content-Type", "application/json"}, {"Authorization", "Bearer sk-x"}, {"User-Agent", "OpenAI/Go 3.0"},
		{"X-Stainless-Retry-Count", "0"}, {"X-Stainless-Timeout", "600"}, {"Accept", "application/json"}, {"Connection", "keep-alive"}} {
		src.Set(h[0], h[1])
	}
	for i := 0; i < b.N; i++ {
		src.CopyTo(&dst)
		dropHopHeaders(&dst)
	}
}

// BenchmarkProxiedRequest is one full non-streamed request through the
// proxy: client → Sturdy → upstream, all over in-memory listeners.
func BenchmarkProxiedRequest(b *testing.B) {
	upLn := fasthttputil.NewInmemoryListener()
	body := upstreamtest.ChatCompletion("hello from the benchmark")
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(body)
	}}
	go func() { _ = up.Serve(upLn) }()
	defer up.Shutdown()

	o := Options{Upstreams: []Upstream{testUpstream("up", "http://inmemory")}, Routes: []Route{testRoute("up")}, Log: zerolog.Nop()}
	p, err := New(o)
	if err != nil {
		b.Fatal(err)
	}
	// Dial the upstream over the in-memory listener.
	up0 := p.tbl.Load().upstreams[0]
	up0.client.Dial = func(string) (net.Conn, error) {
		c, err := upLn.Dial()
		if err != nil {
			return nil, err
		}
		return up0.wrap(c), nil
	}
	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = p.Serve(ln) }() // through the listener guard, as in production
	defer func() { _ = p.Shutdown(context.Background()) }()

	client := &fasthttp.HostClient{Addr: "sturdy", Dial: func(string) (net.Conn, error) { return ln.Dial() }, MaxConns: 64}
	reqBody := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		for pb.Next() {
			req.SetRequestURI("http://sturdy/v1/chat/completions")
			req.Header.SetMethod("POST")
			req.Header.SetContentType("application/json")
			req.Header.Set("Authorization", "Bearer sk-bench")
			req.SetBodyRaw(reqBody)
			if err := client.DoTimeout(req, resp, 5*time.Second); err != nil || resp.StatusCode() != 200 {
				b.Fatalf("%v %d", err, resp.StatusCode())
			}
		}
	})
}
