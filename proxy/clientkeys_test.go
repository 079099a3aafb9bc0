package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

func TestAClientKeyHasItsOwnLimit(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 200, Body: upstreamtest.ChatCompletion("ok")})
	fast := sha256.Sum256([]byte("sk-fast"))
	var opts Options
	h := startProxy(t, up.URL, func(o *Options) {
		o.Clients = []ClientLimit{{RequestsPerSecond: 100, Burst: 100}}
		o.ClientKeys = []ClientKey{{Key: "sk-slow-secret", Name: "slow-team", RequestsPerSecond: 0.001, Burst: 1},
			{SHA256: hex.EncodeToString(fast[:]), Name: "fast-team"}}
		opts = *o
	})
	for i, tt := range []struct {
		key  string
		want int
	}{{"sk-slow-secret", 200}, {"sk-slow-secret", 429}, {"sk-fast", 200}, {"sk-fast", 200}, {"sk-other", 200}} {
		resp, body := h.chat("", "Authorization", "Bearer "+tt.key)
		if resp.StatusCode != tt.want {
			t.Fatalf("request %d with %s: %d %s, want %d", i, tt.key, resp.StatusCode, body, tt.want)
		}
		if tt.want == 429 && (!strings.Contains(string(body), "this key is over its limit of 0.001") || strings.Contains(string(body), "secret")) {
			t.Fatalf("the refusal says %s: want the key's own limit named, never the key", body)
		}
	}
	lines := h.accessLines(5)
	for i, want := range []string{"slow-team", "slow-team", "fast-team", "fast-team", ""} {
		if got, _ := lines[i]["client_key"].(string); got != want {
			t.Fatalf("access line %d: client_key %q, want %q", i, got, want)
		}
	}
	if raw := h.logs.String(); strings.Contains(raw, "sk-slow-secret") || strings.Contains(raw, "sk-fast") {
		t.Fatal("a client key reached the log")
	}
	// A reload that keeps the key's settings keeps its bucket (still
	// spent); one that changes them starts it anew.
	opts.ClientKeys = append(opts.ClientKeys, ClientKey{Key: "sk-new"})
	for _, tt := range []struct {
		rps  float64
		want int
	}{{0.001, 429}, {100, 200}} {
		opts.ClientKeys[0].RequestsPerSecond = tt.rps
		if _, err := h.p.Reload(opts); err != nil {
			t.Fatal(err)
		}
		if resp, body := h.chat("", "Authorization", "Bearer sk-slow-secret"); resp.StatusCode != tt.want {
			t.Fatalf("after a reload to %g requests per second: %d %s, want %d", tt.rps, resp.StatusCode, body, tt.want)
		}
	}
}

// TestAClientKeySetsItsClass: a batch key's requests are batch even when
// their x-sturdy-priority says interactive — with batch_share 50 % of a
// limit of 2, the second waits in the batch queue while another key's
// takes the free place.
func TestAClientKeySetsItsClass(t *testing.T) {
	t.Parallel()
	slow, release := heldUpstream(t, nil)
	batch := upstream.PriorityBatch
	h := startProxy(t, slow, func(o *Options) {
		o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyFixed, Max: 2, BatchShare: 0.5}
		o.Routes[0].PriorityHeader = true
		o.ClientKeys = []ClientKey{{Key: "sk-batch", Priority: &batch}}
	})
	done := make(chan int, 3)
	send := func(key string) {
		go func() {
			resp, _ := h.chat("", "Authorization", "Bearer "+key, "X-Sturdy-Priority", "interactive")
			done <- resp.StatusCode
		}()
	}
	waitFor := func(what string, ok func(upstream.ConcurrencyStatus) bool) {
		t.Helper()
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if ok(endpointConcurrency(t, h)) {
				return
			}
		}
		t.Fatalf("%s: %+v", what, endpointConcurrency(t, h))
	}
	send("sk-batch")
	waitFor("the first batch request holds a place", func(st upstream.ConcurrencyStatus) bool { return st.InFlight == 1 })
	send("sk-batch")
	waitFor("the second waits in the batch queue", func(st upstream.ConcurrencyStatus) bool { return st.Queued[1] == 1 })
	send("sk-other")
	waitFor("another key's takes the free place", func(st upstream.ConcurrencyStatus) bool { return st.InFlight == 2 && st.Queued[1] == 1 })
	close(release)
	for range 3 {
		if code := <-done; code != 200 {
			t.Fatalf("status %d, want every request answered", code)
		}
	}
}

func TestAClientKeysClass(t *testing.T) {
	t.Parallel()
	i, b := upstream.PriorityInteractive, upstream.PriorityBatch
	for _, tt := range []struct {
		name       string
		key        *clientKey
		pr         upstream.Priority
		fromHeader bool
		want       upstream.Priority
	}{
		{"no key: the route's", nil, b, false, b},
		{"a key with no class: the route's", &clientKey{}, b, false, b},
		{"a batch key pins batch", &clientKey{priority: b, hasPriority: true}, i, true, b},
		{"an interactive key lifts a batch route", &clientKey{priority: i, hasPriority: true}, b, false, i},
		{"an interactive key's header may lower it", &clientKey{priority: i, hasPriority: true}, b, true, b},
	} {
		if got := tt.key.classOf(tt.pr, tt.fromHeader); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// budgetIDs are the ids of the budgets limiter l holds.
func budgetIDs(l *clientLimiter) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []string
	for _, h := range l.budgets.Keys() {
		b, _ := l.budgets.Peek(h)
		ids = append(ids, b.id)
	}
	return ids
}

// TestAReloadMovesEachKeysOwnBudget: a reload that changes some keys'
// limits moves each one's budget, and only its own, to its new limiter,
// under the new limit; a key left alone keeps its limiter. Before, each
// changed key copied every budget of its old limiter: O(keys × budgets),
// 42.9 s for 100,000 keys and 4,000 budgets, with Shutdown waiting.
func TestAReloadMovesEachKeysOwnBudget(t *testing.T) {
	t.Parallel()
	keys := []string{"sk-a", "sk-b", "sk-c"}
	var ks []ClientKey
	for _, k := range keys {
		ks = append(ks, ClientKey{Key: k, TokenLimits: TokenLimits{TokensPerMinute: 1000}})
	}
	prev, err := buildClientKeys(ks, ClientLimit{}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	shared := prev[sha256.Sum256([]byte("sk-a"))].limit
	now := time.Now()
	for _, k := range keys {
		shared.mu.Lock()
		b, _ := shared.budgetOf(credHash([]byte(k)), []byte(k), 0, now)
		shared.mu.Unlock()
		b.w[tokensTotal].Settle(0, 400, now) // spent, to be kept
	}
	ks[0].TokensPerMinute, ks[1].TokensPerMinute = 2000, 3000
	next, err := buildClientKeys(ks, ClientLimit{}, prev, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		l := next[sha256.Sum256([]byte(k))].limit
		sum := sha256.Sum256([]byte(k))
		ids := budgetIDs(l)
		if i < 2 && (len(ids) != 1 || ids[0] != hex.EncodeToString(sum[:6])) {
			t.Fatalf("%s's new limiter holds budgets %v, want its own only", k, ids)
		}
		if i == 2 && l != shared {
			t.Fatalf("%s's settings did not change: its limiter should be kept", k)
		}
	}
	a := next[sha256.Sum256([]byte("sk-a"))].limit
	a.mu.Lock()
	b, _ := a.budgets.Peek(credHash([]byte("sk-a")))
	a.mu.Unlock()
	if st := b.w[tokensTotal].State(now); st.Limit != 2000 || st.Remaining != 1600 {
		t.Fatalf("sk-a's moved budget: %+v, want its spend under the new limit", st)
	}
}

// TestAReloadOfClientKeysEndsOnShutdown: building the keys stops once
// Shutdown has begun (errShutDown), so a second signal is not held up by
// a long reload.
func TestAReloadOfClientKeysEndsOnShutdown(t *testing.T) {
	t.Parallel()
	stop := make(chan struct{})
	close(stop)
	if _, err := buildClientKeys([]ClientKey{{Key: "sk-a"}}, ClientLimit{}, nil, nil, stop); err != errShutDown {
		t.Fatalf("with shutdown begun: %v, want errShutDown", err)
	}
}

// BenchmarkReloadClientKeys reloads 100,000 keys, each with a new limit
// of its own, while their old shared limiter holds 4,000 budgets.
func BenchmarkReloadClientKeys(b *testing.B) {
	const n, held = 100_000, 4000
	ks := make([]ClientKey, n)
	for i := range ks {
		ks[i] = ClientKey{Key: "sk-" + strconv.Itoa(i), TokenLimits: TokenLimits{TokensPerMinute: 1000}}
	}
	prev, err := buildClientKeys(ks, ClientLimit{}, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	shared := prev[sha256.Sum256([]byte("sk-0"))].limit
	now := time.Now()
	for i := range held {
		shared.budgetOf(credHash([]byte("sk-"+strconv.Itoa(i))), []byte("sk-"+strconv.Itoa(i)), 0, now)
	}
	for i := range ks {
		ks[i].TokensPerMinute = int64(2000 + i)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := buildClientKeys(ks, ClientLimit{}, prev, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
}
