package proxy

import (
	"crypto/sha256"
	"encoding/hex"
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
