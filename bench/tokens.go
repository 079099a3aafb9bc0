package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// The tokens scenario: 50 closed-loop clients of one key against a
// budget of 10,000 tokens a minute, through a counter after the fact
// (what LiteLLM and Envoy AI Gateway do), one Sturdy, and two Sturdys
// sharing one Redis; the fake server reports each reply's exact usage
// and counts what it served. Then the latency a budget adds, at a fixed
// 500 req/s, in interleaved turns.
const (
	tkLimit   = 10000
	tkClients = 50
	// tkKey is the 50 clients' key; tkSmall a key of its own with a
	// budget of 100 a minute, whose first request must go.
	tkKey, tkSmall = "sk-bench-tokens", "sk-bench-small"
)

// tkServed is one reply the fake server served whole: when, and its
// usage.
type tkServed struct {
	at      time.Duration
	in, out int64
}

// tkServer is the fake server: a chat completion (streamed or not) of a
// random 50–400 tokens, its usage exact (in a stream only when asked,
// as OpenAI's), after 20 ms and 0.2 ms a token (at once when fast). posthoc > 0 makes it
// the counter after the fact too: a request is refused 429 while what
// it served in the last minute is at posthoc or more.
type tkServer struct {
	start   time.Time
	posthoc int64
	// fast answers at once (the latency runs: Sturdy's share stands out).
	fast   bool
	mu     sync.Mutex
	served []tkServed
	ln     net.Listener
	srv    *fasthttp.Server
}

func startTokenServer(posthoc int64, fast bool) (*tkServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &tkServer{start: time.Now(), posthoc: posthoc, fast: fast, ln: ln}
	s.srv = &fasthttp.Server{Handler: s.handle, Logger: quietLogger{}}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

func (s *tkServer) url() string { return "http://" + s.ln.Addr().String() }
func (s *tkServer) close()      { _ = s.srv.Shutdown() }

// spentSince is what s served from since on.
func (s *tkServer) spentSince(since time.Duration) (n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.served {
		if r.at >= since {
			n += r.in + r.out
		}
	}
	return n
}

func (s *tkServer) handle(ctx *fasthttp.RequestCtx) {
	body := ctx.PostBody()
	if s.posthoc > 0 && s.spentSince(time.Since(s.start)-time.Minute) >= s.posthoc {
		ctx.SetStatusCode(429)
		ctx.Response.Header.Set("Retry-After", "1")
		ctx.SetBodyString(`{"error":{"message":"over the tokens a minute","type":"rate_limit_error","code":"rate_limited"}}`)
		return
	}
	in := int64(len(gjson.GetBytes(body, "messages.0.content").Str)+3) / 4
	out := int64(50 + rand.IntN(351))
	if m := gjson.GetBytes(body, "max_tokens").Int(); m > 0 {
		out = min(out, m)
	}
	if !s.fast {
		time.Sleep(20*time.Millisecond + time.Duration(out)*200*time.Microsecond)
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, in, out, in+out)
	record := func() {
		s.mu.Lock()
		s.served = append(s.served, tkServed{at: time.Since(s.start), in: in, out: out})
		s.mu.Unlock()
	}
	if !gjson.GetBytes(body, "stream").Bool() {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"c","object":"chat.completion","model":"fake-model","choices":[{"index":0,"message":{"role":"assistant","content":"` +
			strings.Repeat("tok ", int(out)) + `"},"finish_reason":"stop"}],"usage":` + usage + `}`)
		record()
		return
	}
	withUsage := gjson.GetBytes(body, "stream_options.include_usage").Bool()
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		for i := int64(0); i < out; i += 50 {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n",
				strings.Repeat("tok ", int(min(50, out-i))))
			if w.Flush() != nil {
				return
			}
		}
		if withUsage {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-model\",\"choices\":[],\"usage\":%s}\n\n", usage)
		}
		if _, err := w.WriteString("data: [DONE]\n\n"); err == nil && w.Flush() == nil {
			record()
		}
	})
}

// tkTarget is one way to the fake server: the counter after the fact,
// or one or two Sturdys; limit is its budget (0: tkLimit).
type tkTarget struct {
	name     string
	posthoc  bool
	replicas int
	limit    int64
}

// tkLeased is the leased target's budget: large enough to lease
// (fleet.MinTokenLease ÷ fleet.TokenLeaseShare) and still well under what
// the 50 clients ask.
const tkLeased = 2_000_000

var tkTargets = []tkTarget{{name: "post-hoc counter", posthoc: true}, {name: "sturdy", replicas: 1},
	{name: "sturdy ×2, one Redis", replicas: 2}, {name: "sturdy ×2, one Redis, leased", replicas: 2, limit: tkLeased}}

// tkRun is what one target did.
type tkRun struct {
	target string
	d      time.Duration
	limit  int64
	served []tkServed
	// redisOps is the Redis commands per request (-1: no Redis).
	redisOps float64
	// sent, ok and refused count the clients' requests; usageSeen those
	// of a stream that did not ask for usage whose usage chunk came
	// through; smallAdmitted says the 100-a-minute key's first request
	// went (its estimate is larger than its budget);
	// settled what the Sturdys' sturdy_tokens_total counted (-1: no
	// Sturdy), all what the server served (the small key's request too).
	sent, ok, refused, usageSeen int64
	smallAdmitted                bool
	settled, all                 int64
}

// tkConfig is a measured Sturdy's budget: the 50 clients' key under
// clients:, the small key's own in a client_keys_file (by its SHA-256).
func tkConfig(keysFile string, limit int64) string {
	return "clients:\n  - tokens_per_minute: " + strconv.FormatInt(limit, 10) + "\nclient_keys_file: " + keysFile +
		"\nroutes:\n  - {name: all, path_prefix: /, upstream: fake, retry: {max_attempts: 1}}\n"
}

// startTokenSturdys starts n Sturdys in front of url with budget, sharing
// a Redis started for them when n > 1; it returns their URLs and admin
// addresses.
func startTokenSturdys(bin string, n int, url, budget string) (urls, admins []string, redisAddr string, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	sc := &scenario{name: "tokens", sturdy: budget, redis: n > 1}
	if n > 1 {
		sc.sturdy = "shared_state: {redis_url: REDIS_URL, timeout: 100ms}\n" + budget
	}
	sc, stopRedis, err := withRedis(sc)
	if err != nil {
		return nil, nil, "", stop, err
	}
	stops = append(stops, stopRedis)
	for range n {
		addr, err := freeAddr()
		if err != nil {
			return nil, nil, "", stop, err
		}
		admin, err := freeAddr()
		if err != nil {
			return nil, nil, "", stop, err
		}
		var pid int
		s, _, err := startSturdyAt(bin, addr, admin, sc, []string{url}, &pid)
		if err != nil {
			return nil, nil, "", stop, err
		}
		stops = append([]func(){s}, stops...) // Sturdys stop before their Redis
		urls, admins = append(urls, "http://"+addr), append(admins, admin)
	}
	return urls, admins, sc.redisAddr, stop, nil
}

// tkKeysFile writes the small key's client_keys_file in dir.
func tkKeysFile(dir string) (string, error) {
	sum := sha256.Sum256([]byte(tkSmall))
	path := filepath.Join(dir, "keys.yaml")
	return path, os.WriteFile(path, []byte("keys:\n  - sha256: "+hex.EncodeToString(sum[:])+"\n    name: small\n    tokens_per_minute: 100\n"), 0o600)
}

// runTokens runs the 50 clients through t for d.
func runTokens(bin string, t tkTarget, d time.Duration) (tkRun, error) {
	run := tkRun{target: t.name, d: d, settled: -1, limit: cmp.Or(t.limit, tkLimit), redisOps: -1}
	var posthoc int64
	if t.posthoc {
		posthoc = run.limit
	}
	fake, err := startTokenServer(posthoc, false)
	if err != nil {
		return run, err
	}
	defer fake.close()
	urls, admins, redisAddr := []string{fake.url()}, []string(nil), ""
	if t.replicas > 0 {
		dir, err := os.MkdirTemp("", "sturdy-bench-tokens")
		if err != nil {
			return run, err
		}
		defer os.RemoveAll(dir)
		keys, err := tkKeysFile(dir)
		if err != nil {
			return run, err
		}
		var stop func()
		urls, admins, redisAddr, stop, err = startTokenSturdys(bin, t.replicas, fake.url(), tkConfig(keys, run.limit))
		defer stop()
		if err != nil {
			return run, err
		}
		tkSend(http.DefaultClient, urls[0], tkSmall, false, &run)
		run.smallAdmitted = run.ok == 1
		run.sent, run.ok, run.refused = 0, 0, 0
	}
	fake.mu.Lock()
	started := time.Since(fake.start)
	fake.mu.Unlock()
	ops := redisOps(redisAddr)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	var wg sync.WaitGroup
	for i := range tkClients {
		wg.Go(func() {
			for j := 0; ctx.Err() == nil; j++ {
				if wait := tkSend(client, urls[(i+j)%len(urls)], tkKey, (i+j)%2 == 0, &run); wait > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(wait):
					}
				}
			}
		})
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // the last replies' requests end (and are counted) a moment after them
	if redisAddr != "" && run.sent > 0 {
		run.redisOps = float64(max(redisOps(redisAddr)-ops-1, 0)) / float64(run.sent)
	}
	fake.mu.Lock()
	for _, sv := range fake.served {
		run.all += sv.in + sv.out
		if sv.at >= started {
			sv.at -= started
			run.served = append(run.served, sv)
		}
	}
	fake.mu.Unlock()
	if len(admins) > 0 {
		run.settled = 0
		for _, a := range admins {
			run.settled += tkScrapeTokens(a)
		}
	}
	return run, nil
}

// tkSend sends one request of key (streamed when stream, never asking for
// usage, no max_tokens) and reads its reply whole; wait is how long a
// refusal asked the client to wait (retry-after-ms, at most 5 s; a
// second when it said nothing).
func tkSend(client *http.Client, url, key string, stream bool, run *tkRun) (wait time.Duration) {
	prompt := strings.Repeat("abcd", 100+rand.IntN(300))
	body := `{"model":"fake-model","messages":[{"role":"user","content":"` + prompt + `"}]`
	if stream {
		body += `,"stream":true`
	}
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body+"}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	atomic.AddInt64(&run.sent, 1)
	resp, err := client.Do(req)
	if err != nil {
		return time.Second
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case 200:
		atomic.AddInt64(&run.ok, 1)
		if stream && bytes.Contains(b, []byte(`"usage":{`)) {
			atomic.AddInt64(&run.usageSeen, 1)
		}
		return 0
	case 429:
		atomic.AddInt64(&run.refused, 1)
	}
	if ms, err := strconv.Atoi(resp.Header.Get("Retry-After-Ms")); err == nil {
		return min(time.Duration(ms)*time.Millisecond, 5*time.Second)
	}
	return time.Second
}

// tkScrapeTokens sums sturdy_tokens_total at admin.
func tkScrapeTokens(admin string) (n int64) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "sturdy_tokens_total{") {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			n += int64(v)
		}
	}
	return n
}

// tkFigures are a run's figures: the most served in any 60 s window (÷
// the limit), the mean of the trailing minute's spend ÷ the limit from
// the first minute on (utilisation; 0 for a run shorter than a minute),
// and the server's count of what it served.
type tkFigures struct {
	maxWindow, utilisation float64
	served                 int64
}

func (r tkRun) figures() tkFigures {
	var f tkFigures
	sort.Slice(r.served, func(i, j int) bool { return r.served[i].at < r.served[j].at })
	var sum int64
	lo := 0
	for _, s := range r.served {
		f.served += s.in + s.out
		sum += s.in + s.out
		for r.served[lo].at <= s.at-time.Minute {
			sum -= r.served[lo].in + r.served[lo].out
			lo++
		}
		f.maxWindow = max(f.maxWindow, float64(sum)/float64(r.limit))
	}
	// The fill: the trailing minute's spend ÷ the limit, each second from
	// the first minute's end on (before it, no window is whole).
	var fills []float64
	for t := time.Minute; t <= r.d; t += time.Second {
		var in int64
		for _, s := range r.served {
			if s.at > t-time.Minute && s.at <= t {
				in += s.in + s.out
			}
		}
		fills = append(fills, float64(in)/float64(r.limit))
	}
	for _, v := range fills {
		f.utilisation += v / float64(len(fills))
	}
	return f
}

// tkLatency is the added latency figure: p99 at a fixed 500 req/s,
// non-streamed, in interleaved turns of no budget, a local one and the
// fleet's (a budget no request meets).
type tkLatency struct {
	names []string
	p99s  [][]float64 // per name, one per turn
	// opsPerRequest is the Redis commands per request of the fleet's
	// budget (its turns together; its replicas' beats included).
	opsPerRequest float64
}

func measureTokenLatency(bin string, turns int, each time.Duration) (tkLatency, error) {
	fake, err := startTokenServer(0, true)
	if err != nil {
		return tkLatency{}, err
	}
	defer fake.close()
	route := "routes:\n  - {name: all, path_prefix: /, upstream: fake, retry: {max_attempts: 1}}\n"
	budget := "clients:\n  - tokens_per_minute: 1000000000000\n" + route
	lat := tkLatency{names: []string{"no budget", "budget (local)", "budget (Redis)"}}
	var urls []string
	var redisAddr string
	for i, cfg := range []struct {
		n      int
		budget string
	}{{1, route}, {1, budget}, {2, budget}} {
		u, _, r, stop, err := startTokenSturdys(bin, cfg.n, fake.url(), cfg.budget)
		redisAddr = max(redisAddr, r)
		defer stop()
		if err != nil {
			return lat, fmt.Errorf("%s: %w", lat.names[i], err)
		}
		urls = append(urls, u[0])
	}
	lat.p99s = make([][]float64, len(urls))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}
	body := `{"model":"fake-model","max_tokens":50,"messages":[{"role":"user","content":"` + strings.Repeat("abcd", 100) + `"}]}`
	var ops int64
	for range turns {
		for i, u := range urls {
			before := redisOps(redisAddr)
			lat.p99s[i] = append(lat.p99s[i], fixedRate(client, u, body, 500, each))
			if i == len(urls)-1 {
				ops += max(redisOps(redisAddr)-before-1, 0)
			}
		}
	}
	lat.opsPerRequest = float64(ops) / (float64(turns) * 500 * each.Seconds())
	return lat, nil
}

// fixedRate sends body to url at rate a second for d (each from its
// scheduled start) and returns the p99 latency (ms) of those answered
// 200.
func fixedRate(client *http.Client, url, body string, rate int, d time.Duration) float64 {
	var mu sync.Mutex
	var ms []float64
	var wg sync.WaitGroup
	start, gap := time.Now(), time.Second/time.Duration(rate)
	for i := 0; time.Duration(i)*gap < d; i++ {
		at := start.Add(time.Duration(i) * gap)
		time.Sleep(time.Until(at))
		wg.Go(func() {
			req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+tkKey)
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				mu.Lock()
				ms = append(ms, millis(time.Since(at)))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return pctl(ms, 99)
}

// tokensReport prints the runs and the latency.
func tokensReport(w io.Writer, runs []tkRun, lat tkLatency) {
	fmt.Fprintf(w, "### tokens: %d clients of one key\n\n", tkClients)
	fmt.Fprintln(w, "| target | limit (tokens a minute) | run s | most in any 60 s (× limit) | utilisation (the trailing minute ÷ limit, mean from 60 s) | requests | 200 | 429 | usage chunks unasked | settled = served | 100-a-minute key's first | Redis commands / request |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
	for _, r := range runs {
		f := r.figures()
		settled, small, ops := "–", "–", "–"
		if r.settled >= 0 {
			settled = fmt.Sprintf("%v (%d of %d)", r.settled == r.all, r.settled, r.all)
			small = map[bool]string{true: "admitted", false: "refused"}[r.smallAdmitted]
		}
		if r.redisOps >= 0 {
			ops = fmt.Sprintf("%.3f", r.redisOps)
		}
		fmt.Fprintf(w, "| %s | %d | %.0f | %.3f | %.0f %% | %d | %d | %d | %d | %s | %s | %s |\n", r.target, r.limit, r.d.Seconds(),
			f.maxWindow, 100*f.utilisation, r.sent, r.ok, r.refused, r.usageSeen, settled, small, ops)
	}
	if len(lat.p99s) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### tokens: p99 at 500 req/s, %d interleaved turns (ms: min – max)\n\n| target | p99 | added p99 (vs no budget, per turn) |\n|---|---:|---:|\n", len(lat.p99s[0]))
	for i, name := range lat.names {
		lo, hi := minMax(lat.p99s[i])
		var added []float64
		for j, v := range lat.p99s[i] {
			added = append(added, v-lat.p99s[0][j])
		}
		alo, ahi := minMax(added)
		fmt.Fprintf(w, "| %s | %.2f – %.2f | %+.2f – %+.2f |\n", name, lo, hi, alo, ahi)
	}
	fmt.Fprintf(w, "\nRedis commands per request of the fleet's budget (its turns): %.3f\n", lat.opsPerRequest)
}

func minMax(vs []float64) (lo, hi float64) {
	for i, v := range vs {
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	return lo, hi
}

// tokensSolo is the tokens scenario as a solo measurement: each target
// for -duration (bench/README.md's figures: 130 s, two minutes and a
// window's worth), then -tries turns (at most 5) of the latency, 3 s
// each (a sixth of -duration when that is shorter).
func tokensSolo(bin string, c *command) (func(io.Writer), error) {
	var runs []tkRun
	for _, t := range tkTargets {
		r, err := runTokens(bin, t, c.s.duration)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.name, err)
		}
		runs = append(runs, r)
	}
	lat, err := measureTokenLatency(bin, max(min(c.tries, 5), 1), min(3*time.Second, c.s.duration/6)) // a smoke run's are short
	if err != nil {
		return nil, err
	}
	return func(w io.Writer) { tokensReport(w, runs, lat) }, nil
}
