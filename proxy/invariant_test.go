package proxy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"sturdy/breaker"
	"sturdy/policy"
)

// The chaos property test: randomised fault schedules — primaries killed
// and restarted, resets, stalls, 429 storms with and without a wait, 5xx
// bursts, slow starts, streams cut after their commit point — over a pool
// and its fallback, where one target always stays able to answer. It
// asserts that no client sees a failure, and that the upstreams receive
// no more than the retry budget allows. Every fault is chosen by the fake
// upstream from (seed, request index, the attempt it is on that server),
// never the clock, so a failing seed replays: STURDY_CHAOS_SEED=<seed>.

const (
	chaosRequests = 300 // client requests per run
	chaosWorkers  = 4   // at once
	chaosWords    = 8   // words of each canonical answer
)

// chaosWord is word k of request i's canonical answer.
func chaosWord(i, k int) string { return fmt.Sprintf("w%d-%d ", k, i) }

// chaosAnswer is request i's canonical answer.
func chaosAnswer(i int) string {
	var b strings.Builder
	for k := 0; k < chaosWords; k++ {
		b.WriteString(chaosWord(i, k))
	}
	return b.String()
}

// chaosFault is what a fake upstream does with one attempt.
type chaosFault uint8

const (
	faultNone chaosFault = iota
	faultReset
	fault5xx
	fault429Wait
	fault429Bare
	faultStall
	faultSlow
	faultCut // a stream cut after its commit point (some words out)
)

// chaosServer is a fake model server on a fixed loopback port: it serves
// chat completions (JSON or SSE) of the canonical answers, acting out the
// fault its schedule chooses for each attempt; it can be killed (nothing
// listens) and restarted on its port. A continuing server answers a
// trailing assistant message with the rest of the answer (prefill).
type chaosServer struct {
	name     string
	addr     string
	schedule func(i, attempt int) chaosFault // nil: never faults
	mu       sync.Mutex
	srv      *http.Server
	seen     map[int]int // attempts per request index
	requests atomic.Int64
}

func startChaosServer(t *testing.T, name string, schedule func(i, attempt int) chaosFault) *chaosServer {
	t.Helper()
	s := &chaosServer{name: name, addr: freePort(t), schedule: schedule, seen: map[int]int{}}
	s.start(t)
	t.Cleanup(s.kill)
	return s
}

func (s *chaosServer) url() string { return "http://" + s.addr }

// start listens on the server's port (again, after a kill).
func (s *chaosServer) start(t *testing.T) {
	var ln net.Listener
	var err error
	for try := 0; try < 50; try++ { // the port was just closed: it may take a moment
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Errorf("%s: cannot listen again on %s: %v", s.name, s.addr, err)
		return
	}
	srv := &http.Server{Handler: http.HandlerFunc(s.handle), IdleTimeout: 3 * time.Second,
		ErrorLog: nil, ReadHeaderTimeout: 5 * time.Second}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// kill closes the listener and every connection: nothing listens.
func (s *chaosServer) kill() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// chaosRequest is what a fake reads of a request.
type chaosRequest struct {
	Stream   bool `json:"stream"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
}

func (s *chaosServer) handle(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	var req chaosRequest
	body, _ := io.ReadAll(r.Body)
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad body"}}`, 400)
		return
	}
	i, _ := strconv.Atoi(strings.TrimPrefix(req.Messages[0].Content, "req-"))
	from := 0 // a continuation: the words already sent
	if last := req.Messages[len(req.Messages)-1]; last.Role == "assistant" {
		for from = 0; from <= chaosWords && wordsUpTo(i, from) != last.Content; from++ {
		}
		if from > chaosWords {
			http.Error(w, `{"error":{"message":"the continuation's text is not the answer's start"}}`, 400)
			return
		}
	}
	s.mu.Lock()
	attempt := s.seen[i]
	s.seen[i]++
	s.mu.Unlock()
	fault := faultNone
	if s.schedule != nil {
		fault = s.schedule(i, attempt)
	}
	switch fault {
	case faultReset:
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
		}
		return
	case fault5xx:
		http.Error(w, `{"error":{"message":"overloaded"}}`, 503)
		return
	case fault429Wait:
		w.Header().Set("Retry-After-Ms", strconv.Itoa(50+i%100))
		http.Error(w, `{"error":{"message":"slow down"}}`, 429)
		return
	case fault429Bare:
		http.Error(w, `{"error":{"message":"slow down"}}`, 429)
		return
	case faultStall:
		select { // past first_byte: Sturdy gives up and closes
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		return
	case faultSlow:
		time.Sleep(time.Duration(50+i%100) * time.Millisecond)
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"id":"c-%d","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}]}`,
			i, chaosAnswer(i)[len(wordsUpTo(i, from)):])
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	event := func(delta string, finish string) {
		_, _ = fmt.Fprintf(w, `data: {"id":"c-%d","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n",
			i, delta, finish)
		fl.Flush()
	}
	event(`{"role":"assistant","content":""}`, "null")
	cutAt := -1
	if fault == faultCut {
		cutAt = 1 + i%(chaosWords/2) // after a word at least: past the commit point
	}
	for k := from; k < chaosWords; k++ {
		if k == cutAt {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close() // mid-stream: no last chunk, no [DONE]
			}
			return
		}
		b, _ := json.Marshal(chaosWord(i, k))
		event(`{"content":`+string(b)+`}`, "null")
	}
	event(`{}`, `"stop"`)
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// wordsUpTo is the first n words of request i's answer.
func wordsUpTo(i, n int) string {
	var b strings.Builder
	for k := 0; k < n && k < chaosWords; k++ {
		b.WriteString(chaosWord(i, k))
	}
	return b.String()
}

// chaosRand is a uniform value in [0, 1) of (seed, parts): the same on
// every run of the seed.
func chaosRand(seed int64, parts ...any) float64 {
	sum := sha256.Sum256([]byte(fmt.Sprint(seed, parts)))
	return float64(binary.LittleEndian.Uint64(sum[:8])>>11) / (1 << 53)
}

// chaosSchedule is a primary's faults: transient ones at a low rate, and
// in windows of request indices (from the seed) bursts of 5xx and storms
// of 429, with and without a wait. stream says cuts may happen (the
// route can hide them: stream_hold or a continuation).
func chaosSchedule(seed int64, server string, stream bool) func(i, attempt int) chaosFault {
	window := func(kind string, i int) bool { return chaosRand(seed, kind, server, i/25) < 0.15 }
	return func(i, attempt int) chaosFault {
		u := chaosRand(seed, server, i, attempt)
		switch {
		case window("burst", i) && u < 0.7:
			return fault5xx
		case window("storm", i) && u < 0.6:
			if chaosRand(seed, "wait", server, i/25) < 0.5 {
				return fault429Wait
			}
			return fault429Bare
		case u < 0.05:
			return faultReset
		case u < 0.10:
			return fault5xx
		case u < 0.13:
			return fault429Wait
		case u < 0.15:
			return fault429Bare
		case u < 0.17:
			return faultStall
		case u < 0.22:
			return faultSlow
		case stream && u < 0.32:
			return faultCut
		}
		return faultNone
	}
}

// steadySchedule is a fallback's: at most a slow start or a 5xx on a
// request's first attempt there — it always answers within its attempts.
func steadySchedule(seed int64, server string) func(i, attempt int) chaosFault {
	return func(i, attempt int) chaosFault {
		if attempt > 0 {
			return faultNone
		}
		switch u := chaosRand(seed, server, i); {
		case u < 0.05:
			return fault5xx
		case u < 0.10:
			return faultSlow
		}
		return faultNone
	}
}

// TestNoRequestFailsWhileATargetCanAnswer is the invariant the README
// promises under "Giving up", held under a seeded random schedule.
func TestNoRequestFailsWhileATargetCanAnswer(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("STURDY_CHAOS_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	defer func() {
		if t.Failed() {
			t.Logf("replay with STURDY_CHAOS_SEED=%d go test -run TestNoRequestFailsWhileATargetCanAnswer ./proxy", seed)
		}
	}()
	p1 := startChaosServer(t, "p1", chaosSchedule(seed, "p1", false))
	p2 := startChaosServer(t, "p2", chaosSchedule(seed, "p2", false))
	fb := startChaosServer(t, "fb", steadySchedule(seed, "fb"))
	st := startChaosServer(t, "st", chaosSchedule(seed, "st", true))
	cont := startChaosServer(t, "cont", nil) // continues a cut stream: always answers
	servers := []*chaosServer{p1, p2, fb, st, cont}

	upstream := func(name string, endpoints ...*chaosServer) Upstream {
		u := testUpstream(name, "")
		for _, e := range endpoints {
			u.Endpoints = append(u.Endpoints, e.url())
		}
		u.FirstByteTimeout, u.IdleTimeout = 500*time.Millisecond, time.Second
		u.Breaker = breaker.Settings{OpenFor: time.Second} // the defaults, a short open
		return u
	}
	route := func(name, prefix, up string, fallbacks ...string) Route {
		r := testRoute(up)
		r.Name, r.PathPrefix, r.Deadline = name, prefix, 30*time.Second
		r.Retry.Backoff = policy.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}
		for _, f := range fallbacks {
			r.Fallbacks = append(r.Fallbacks, Target{Upstream: f})
		}
		return r
	}
	contUp := upstream("cont", cont)
	contUp.Continuation = ContinuePrefill
	hold := route("hold", "/hold/", "st", "fb")
	hold.StreamHold = StreamHold{Max: 5 * time.Second, Bytes: 64 << 10}
	h := startProxy(t, "", func(o *Options) {
		o.Upstreams = []Upstream{upstream("prim", p1, p2), upstream("fb", fb), upstream("st", st), contUp}
		o.Routes = []Route{route("plain", "/", "prim", "fb"), hold, route("cont", "/cont/", "st", "cont")}
		o.Rand = func(n int64) int64 { return int64(chaosRand(seed, "jitter", n) * float64(n)) }
		o.Log = zerolog.Nop() // hundreds of access lines: not read here
	})

	// Kills: a window of request indices (from the seed) in which one
	// primary endpoint, or both, is down.
	var kills sync.Mutex
	killed := map[*chaosServer]bool{}
	setDown := func(s *chaosServer, down bool) {
		kills.Lock()
		defer kills.Unlock()
		switch {
		case down && !killed[s]:
			s.kill()
		case !down && killed[s]:
			s.start(t)
		default:
			return
		}
		killed[s] = down
	}
	downAt := func(s *chaosServer, i int) bool { return chaosRand(seed, "kill", s.name, i/40) < 0.2 }

	start := time.Now()
	var next atomic.Int64
	var failures sync.Map
	var wg sync.WaitGroup
	for w := 0; w < chaosWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= chaosRequests || time.Since(start) > 60*time.Second {
					return
				}
				setDown(p1, downAt(p1, i))
				setDown(p2, downAt(p2, i))
				kind := []string{"/v1/chat/completions", "/v1/chat/completions", "/hold/v1/chat/completions", "/cont/v1/chat/completions"}[i%4]
				if why := chaosAsk(h, kind, i); why != "" {
					failures.Store(i, kind+": "+why)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := 0
	failures.Range(func(k, v any) bool {
		if n++; n <= 10 {
			t.Errorf("request %d failed: %v", k, v)
		}
		return true
	})
	if n > 0 {
		t.Errorf("%d of %d requests failed while a target could answer", n, chaosRequests)
	}

	var upstreamRequests int64
	for _, s := range servers {
		upstreamRequests += s.requests.Load()
	}
	stale := 0.0
	for _, up := range h.p.tbl.Load().upstreams {
		for _, ep := range up.endpointsNow() {
			var m dto.Metric
			_ = h.p.m.Attempts.WithLabelValues(up.name, ep.addr, "stale").Write(&m)
			stale += m.GetCounter().GetValue()
		}
	}
	// The retry budget's bound, per upstream summed: retries add at most
	// ratio × the first attempts plus min_per_second per second; a stale
	// resend is free of it. Every client request is a first attempt on one
	// target at least, a failover a first attempt on another.
	bound := float64(chaosRequests)*(1+DefaultBudgetRatio)*2 + DefaultBudgetPerSecond*elapsed.Seconds()*4 + stale
	t.Logf("seed %d: %d requests in %v, %d upstream requests (%.2f×), %v stale resends, bound %.0f",
		seed, chaosRequests, elapsed.Round(time.Millisecond), upstreamRequests, float64(upstreamRequests)/chaosRequests, stale, bound)
	if float64(upstreamRequests) > bound {
		t.Errorf("amplification past the retry budget: %d upstream requests for %d", upstreamRequests, chaosRequests)
	}
}

// chaosAsk sends request i to path and says what is wrong with its
// answer ("" for nothing): a status other than 200, an interrupted
// stream, or a text other than the canonical answer.
func chaosAsk(h *harness, path string, i int) string {
	stream := !strings.HasPrefix(path, "/v1/")
	body := fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":"req-%d"}]}`, stream, i)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", h.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	var text strings.Builder
	if !stream {
		var c struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || len(c.Choices) == 0 {
			return fmt.Sprintf("an unreadable body: %v", err)
		}
		text.WriteString(c.Choices[0].Message.Content)
	} else {
		done := false
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			switch {
			case !ok:
			case data == "[DONE]":
				done = true
			case strings.Contains(data, `"error"`):
				return "an error in the stream: " + data
			default:
				var c struct {
					Choices []struct {
						Delta struct{ Content string } `json:"delta"`
					} `json:"choices"`
				}
				if json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 {
					text.WriteString(c.Choices[0].Delta.Content)
				}
			}
		}
		if err := sc.Err(); err != nil || !done {
			return fmt.Sprintf("a stream that did not end with [DONE] (%v)", err)
		}
	}
	if text.String() != chaosAnswer(i) {
		return fmt.Sprintf("the text %q, want %q", text.String(), chaosAnswer(i))
	}
	return ""
}
