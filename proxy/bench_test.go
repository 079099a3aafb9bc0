package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"sturdy/events"
	"sturdy/internal/otlptest"
	"sturdy/internal/upstreamtest"
	"sturdy/listener"
	"sturdy/policy"
	"sturdy/upstream"
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
func BenchmarkProxiedRequest(b *testing.B) { benchProxied(b, nil) }

// BenchmarkProxiedRequestTraced is BenchmarkProxiedRequest with tracing
// on, every request sampled (its spans exported to an in-process OTLP
// sink: export included) or none (traceparent still sent upstream).
func BenchmarkProxiedRequestTraced(b *testing.B) {
	rcv, err := otlptest.New(false)
	if err != nil {
		b.Fatal(err)
	}
	defer rcv.Close()
	for _, ratio := range []float64{1, 0} {
		b.Run(map[float64]string{1: "sampled", 0: "unsampled"}[ratio], func(b *testing.B) {
			benchProxied(b, func(o *Options) { withTracing(b, o, rcv, ratio) })
		})
	}
}

func benchProxied(b *testing.B, edit func(*Options)) {
	benchProxiedFrom(b, benchUpstream(b), benchChat, edit)
}

// BenchmarkProxiedStream is BenchmarkProxiedRequest for a streamed chat
// completion (16 content events, a finish and [DONE], a chunk each): the
// stream's relay, event scanning and end included.
func BenchmarkProxiedStream(b *testing.B) {
	benchProxiedFrom(b, benchStreamUpstream(b), benchStreamedChat, nil)
}

// BenchmarkProxiedAgentRequest is BenchmarkProxiedRequest with a 200 KB
// agent body (a system prompt, then tool calls and their results), as
// sent (plain) and under a token budget (budgeted: its text estimated);
// a walk of the whole body shows here, not with the small one.
func BenchmarkProxiedAgentRequest(b *testing.B) {
	body := agentBody(200 << 10)
	b.Run("plain", func(b *testing.B) {
		benchProxiedFrom(b, benchUpstream(b), body, func(o *Options) { o.Routes[0].MaxBody = 1 << 20 })
	})
	b.Run("budgeted", func(b *testing.B) {
		benchProxiedFrom(b, benchUpstream(b), body, func(o *Options) {
			o.Routes[0].MaxBody = 1 << 20
			o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: 1 << 40}}}
		})
	})
}

// agentBody is a chat request of about n bytes: a system prompt, then
// tool calls and their results, as an agent's later turns carry.
func agentBody(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","max_tokens":512,"messages":[{"role":"system","content":"` + strings.Repeat("You are helpful. ", 200) + `"}`)
	for sb.Len() < n {
		sb.WriteString(`,{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"path\":\"a.go\"}"}}]}`)
		sb.WriteString(`,{"role":"tool","tool_call_id":"c1","content":"` + strings.Repeat("package main; func x() {} ", 40) + `"}`)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// The benchmarks' request bodies.
var (
	benchChat         = []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	benchStreamedChat = []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
)

// benchProxiedFrom runs Sturdy (its options edited by edit) in front of
// the upstream on upLn, and parallel clients sending body through it.
func benchProxiedFrom(b *testing.B, upLn *fasthttputil.InmemoryListener, body []byte, edit func(*Options)) {
	ln := serveInMemory(b, upLn, edit)
	benchClients(b, ln, body)
}

// serveInMemory runs a proxy with the benchmarks' upstream and route, as
// edit adjusts them, on an in-memory listener until tb ends; its upstream
// is dialled over upLn.
func serveInMemory(tb testing.TB, upLn *fasthttputil.InmemoryListener, edit func(*Options)) *fasthttputil.InmemoryListener {
	o := Options{Upstreams: []upstream.Options{testUpstream("up", "http://inmemory")}, Routes: []Route{testRoute("up")}, Log: zerolog.Nop()}
	if edit != nil {
		edit(&o)
	}
	p, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	// Dial the upstream over the in-memory listener (before any request).
	p.env.Dial = func(string) (net.Conn, error) { return upLn.Dial() }
	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = p.Serve(ln) }() // through the listener guard, as in production
	tb.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return ln
}

// BenchmarkFloorRequest is BenchmarkProxiedRequest's round trip through
// the floor instead of Sturdy: a fasthttp server handing each request to
// one HostClient, as bench/peers/floor does. On in-memory connections,
// with no kernel and no other process in it, Sturdy ÷ floor is what
// Sturdy's own work costs, steadier than the load harness can tell it.
func BenchmarkFloorRequest(b *testing.B) {
	upLn := benchUpstream(b)
	c := &fasthttp.HostClient{Addr: "inmemory", Dial: func(string) (net.Conn, error) { return upLn.Dial() }, MaxConns: 4096}
	floor := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if err := c.Do(&ctx.Request, &ctx.Response); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		}
	}}
	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = floor.Serve(ln) }()
	defer func() { _ = floor.Shutdown() }()
	benchClients(b, ln, benchChat)
}

// benchUpstream serves a chat completion on an in-memory listener for the
// benchmark's length.
func benchUpstream(tb testing.TB) *fasthttputil.InmemoryListener {
	upLn := fasthttputil.NewInmemoryListener()
	body := upstreamtest.ChatCompletion("hello from the benchmark")
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(body)
	}}
	go func() { _ = up.Serve(upLn) }()
	tb.Cleanup(func() { _ = up.Shutdown() })
	return upLn
}

// benchUpstreamTCP serves a chat completion on a loopback port for the
// benchmark's length and returns its address.
func benchUpstreamTCP(b *testing.B) string {
	body := upstreamtest.ChatCompletion("hello from the benchmark")
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(body)
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = up.Serve(ln) }()
	b.Cleanup(func() { _ = up.Shutdown() })
	return ln.Addr().String()
}

// benchStreamUpstream serves a streamed chat completion on an in-memory
// listener for the benchmark's length: the same chunked reply, written
// whole, to every request.
func benchStreamUpstream(tb testing.TB) *fasthttputil.InmemoryListener {
	var reply bytes.Buffer
	reply.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	for _, ev := range upstreamtest.SSE(upstreamtest.Words(16, "word ")...) {
		fmt.Fprintf(&reply, "%x\r\n%s\r\n", len(ev), ev)
	}
	reply.WriteString("0\r\n\r\n")
	ln := fasthttputil.NewInmemoryListener()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveCanned(c, reply.Bytes())
		}
	}()
	tb.Cleanup(func() { _ = ln.Close() })
	return ln
}

// serveCanned answers each request on c (its head, then a body of its
// Content-Length) with raw, until c ends.
func serveCanned(c net.Conn, raw []byte) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		size := 0
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
			if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
				for _, d := range bytes.TrimSpace(v) {
					size = size*10 + int(d-'0')
				}
			}
		}
		if _, err := br.Discard(size); err != nil {
			return
		}
		if _, err := c.Write(raw); err != nil {
			return
		}
	}
}

// benchClients sends chat completions (reqBody) through the proxy on ln
// from parallel clients for the benchmark's length.
func benchClients(b *testing.B, ln *fasthttputil.InmemoryListener, reqBody []byte) {
	client := benchClient(ln)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		for pb.Next() {
			benchRoundTrip(b, client, req, resp, reqBody)
		}
	})
}

// benchClient is the benchmarks' client of the proxy on ln.
func benchClient(ln *fasthttputil.InmemoryListener) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: "sturdy", Dial: func(string) (net.Conn, error) { return ln.Dial() }, MaxConns: 64}
}

// benchRoundTrip posts reqBody as a chat completion through client and
// fails tb unless it comes back 200; req and resp are reused.
func benchRoundTrip(tb testing.TB, client *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, reqBody []byte) {
	req.SetRequestURI("http://sturdy/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.Header.Set("Authorization", "Bearer sk-bench")
	req.SetBodyRaw(reqBody)
	if err := client.DoTimeout(req, resp, 5*time.Second); err != nil || resp.StatusCode() != 200 {
		tb.Fatalf("%v %d", err, resp.StatusCode())
	}
}

// BenchmarkProxiedRequestTCP is BenchmarkProxiedRequest over loopback TCP
// (client → Sturdy → upstream), with the client connections watched for
// leaving and without, side by side: the watch's cost. Each client
// connection carries keepAlive requests, so the per-connection epoll
// calls count as they do for a client that reuses its connections.
func BenchmarkProxiedRequestTCP(b *testing.B) {
	upAddr := benchUpstreamTCP(b)
	for _, watched := range []bool{true, false} {
		name := map[bool]string{true: "watched", false: "unwatched"}[watched]
		b.Run(name, func(b *testing.B) {
			listener.WatchClients = watched
			defer func() { listener.WatchClients = true }()
			p, err := New(Options{Upstreams: []upstream.Options{testUpstream("up", "http://"+upAddr)},
				Routes: []Route{testRoute("up")}, Log: zerolog.Nop()})
			if err != nil {
				b.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = p.Serve(ln) }()
			defer func() { _ = p.Shutdown(context.Background()) }()
			const keepAlive = 100
			client := &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 64, MaxConnDuration: 0}
			reqBody := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				for i := 0; pb.Next(); i++ {
					req.SetRequestURI("http://sturdy/v1/chat/completions")
					req.Header.SetMethod("POST")
					req.Header.SetContentType("application/json")
					req.SetBodyRaw(reqBody)
					if i%keepAlive == keepAlive-1 {
						req.SetConnectionClose() // a new client connection now and then
					}
					if err := client.DoTimeout(req, resp, 5*time.Second); err != nil || resp.StatusCode() != 200 {
						b.Fatalf("%v %d", err, resp.StatusCode())
					}
					req.Reset()
				}
			})
		})
	}
}

// cooldownCase is an attempt's cooldown check on an upstream with no
// cooldown in force, or one in force for another credential (the key is
// hashed and looked up).
func cooldownCase(tb testing.TB, inForce bool) (check func() time.Duration) {
	p, err := New(Options{Upstreams: []upstream.Options{testUpstream("up", "http://127.0.0.1:1")}, Routes: []Route{testRoute("up")},
		Log: zerolog.Nop()})
	if err != nil {
		tb.Fatal(err)
	}
	up := p.tbl.Load().upstreams[0]
	now := time.Now()
	if inForce {
		up.Cooldowns().Set(12345, now, now.Add(time.Hour))
	}
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.Set("Authorization", "Bearer sk-bench")
	ex := &exchange{p: p, ctx: ctx}
	v := &visit{ex: ex, t: &target{up: up}, model: "gpt-4o"}
	return func() time.Duration {
		v.coolKnown = false // a new request: its key is computed again
		return v.cooldownLeft(now)
	}
}

func BenchmarkCooldownCheck(b *testing.B) {
	for _, inForce := range []bool{false, true} {
		b.Run(map[bool]string{false: "none", true: "one_in_force"}[inForce], func(b *testing.B) {
			check := cooldownCase(b, inForce)
			b.ReportAllocs()
			for b.Loop() {
				_ = check()
			}
		})
	}
}

// BenchmarkCommitPoint reads a chat stream's head event by event and
// judges each, as holdToCommit does until the first content.
func BenchmarkCommitPoint(b *testing.B) {
	head := []byte(strings.Join(upstreamtest.SSE("Hello", " world"), ""))
	b.ReportAllocs()
	b.SetBytes(int64(len(head)))
	for b.Loop() {
		judgeAll(head)
	}
}

func judgeAll(head []byte) {
	for rest := head; len(rest) > 0; {
		ev, n := events.Next(events.SSE, rest)
		if n <= 0 {
			return
		}
		if m, _ := policy.Judge(policy.APIChat, ev.Name, ev.Data); m == policy.MarkContent {
			return
		}
		rest = rest[n:]
	}
}

// TestHotChecksDoNotAllocate guards the proxy's per-request checks: the
// cooldown check and the commit-point parse of a stream's head. It is not
// parallel: AllocsPerRun counts the whole process's allocations.
func TestHotChecksDoNotAllocate(t *testing.T) {
	head := []byte(strings.Join(upstreamtest.SSE("Hello"), ""))
	none, inForce := cooldownCase(t, false), cooldownCase(t, true)
	for name, f := range map[string]func(){
		"cooldown, none in force": func() { _ = none() },
		"cooldown, one in force":  func() { _ = inForce() },
		"commit point":            func() { judgeAll(head) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations", name, n)
		}
	}
}

// BenchmarkTokenBudgetReserveSettle is a request's local token budget:
// its client's budget found (budgetOf), its estimate reserved, settled
// to its usage — what the hook adds to a budgeted request (0 allocations).
func BenchmarkTokenBudgetReserveSettle(b *testing.B) {
	cl := newClientLimiter(ClientLimit{KeyHeader: DefaultKeyHeader, TokenLimits: TokenLimits{TokensPerMinute: 1 << 40}}.withDefaults(), nil)
	key := []byte("Bearer sk-bench")
	h := credHash(key)
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		cl.mu.Lock()
		bud, _ := cl.budgetOf(h, key, 0, now)
		cl.mu.Unlock()
		w := &bud.w[tokensTotal]
		if ok, _ := w.Reserve(300, now); ok {
			w.Settle(300, 280, now)
		}
	}
}

// steadyRate is BenchmarkSteadyRate's pace: a sidecar's unsaturated load.
const steadyRate = 2000

// BenchmarkSteadyRate sends requests at a fixed 2,000/s over loopback TCP
// (client → proxy → upstream, all in this process) through Sturdy and
// through the floor (a fasthttp server handing each request to one
// HostClient) side by side, and reports the process's CPU per request
// (cpu-µs/req: getrusage, the client's and the upstream's share alike in
// both). At a steady, unsaturated rate the fixed per-request work — wake-
// ups, timers, scheduling — is what a request costs, not throughput:
// go test -run X -bench SteadyRate -benchtime 4000x ./proxy.
func BenchmarkSteadyRate(b *testing.B) {
	upAddr := benchUpstreamTCP(b)
	upURL := "http://" + upAddr
	b.Run("sturdy", func(b *testing.B) {
		p, err := New(Options{Upstreams: []upstream.Options{testUpstream("up", upURL)}, Routes: []Route{testRoute("up")}, Log: zerolog.Nop()})
		if err != nil {
			b.Fatal(err)
		}
		steadyClients(b, p.Serve, func() { _ = p.Shutdown(context.Background()) })
	})
	b.Run("floor", func(b *testing.B) {
		c := &fasthttp.HostClient{Addr: upAddr, MaxConns: 4096}
		floor := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			if err := c.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			}
		}}
		steadyClients(b, floor.Serve, func() { _ = floor.Shutdown() })
	})
}

// steadyClients serves on a loopback listener with serve and sends b.N
// chat completions at steadyRate, open loop (each on its own goroutine at
// its time, 64 connections), then reports the CPU per request.
func steadyClients(b *testing.B, serve func(net.Listener) error, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = serve(ln) }()
	defer stop()
	client := &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 64}
	reqBody := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	send := func() error {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://sturdy/v1/chat/completions")
		req.Header.SetMethod("POST")
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(reqBody)
		if err := client.DoTimeout(req, resp, 5*time.Second); err != nil {
			return err
		}
		if resp.StatusCode() != 200 {
			return fmt.Errorf("status %d", resp.StatusCode())
		}
		return nil
	}
	for range 64 { // the connections open before the measure
		if err := send(); err != nil {
			b.Fatal(err)
		}
	}
	var failed atomic.Int64
	var wg sync.WaitGroup
	cpu0 := processCPU()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		// Each request at its own time (behind, at once): a ticker drops
		// the ticks a busy loop misses, and the rate with them.
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / steadyRate)))
		wg.Go(func() {
			if send() != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d requests failed", n, b.N)
	}
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/req")
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
