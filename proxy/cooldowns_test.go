package proxy

import (
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// TestClientBucketsPastTheBoundDropTheLeastRecentlyUsed: a `clients:`
// limit keeps at most upstream.MaxTrackedKeys buckets, however many keys come.
func TestClientBucketsPastTheBoundDropTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	evicted := 0
	l := newClientLimiter(ClientLimit{KeyHeader: "Authorization", RequestsPerSecond: 1, Burst: 1}, func() { evicted++ })
	now := time.Now()
	if _, ok := l.take([]byte("Bearer first"), now); !ok {
		t.Fatal("first request refused")
	}
	if _, ok := l.take([]byte("Bearer first"), now); ok {
		t.Fatal("over its limit, but let through")
	}
	key := make([]byte, 8)
	for i := 0; i < upstream.MaxTrackedKeys+10; i++ {
		key = append(key[:0], byte(i), byte(i>>8), byte(i>>16), byte(i>>24))
		l.take(key, now)
	}
	if n := l.buckets.Len(); n != upstream.MaxTrackedKeys || evicted != 11 {
		t.Fatalf("%d buckets (%d evicted), want %d (11)", n, evicted, upstream.MaxTrackedKeys)
	}
}

// TestOneReplyCannotLockAKeyOutForAYear: a 429 with Retry-After of a
// year, or a 200 with x-ratelimit-reset-requests: 8760h, makes a
// cooldown of at most cooldown.max (10 minutes by default); once a capped
// one ends, the next request reaches the upstream. Before, both made a
// cooldown of a year.
func TestOneReplyCannotLockAKeyOutForAYear(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t,
		upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "31536000"}}},
		upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader, {"X-Ratelimit-Remaining-Requests", "0"},
			{"X-Ratelimit-Reset-Requests", "8760h"}}, Body: upstreamtest.ChatCompletion("ok")},
		upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader}, Body: upstreamtest.ChatCompletion("ok")})
	h := startProxy(t, up.URL, nil)
	for i, m := range []string{"a", "b"} {
		h.chat(`{"model":"` + m + `","messages":[]}`)
		st := h.p.Upstreams()[0]
		if st.CooldownUntil == nil || time.Until(*st.CooldownUntil) > upstream.DefaultCooldownMax+time.Second {
			t.Fatalf("reply %d: cooldown until %v, want at most %v from now", i, st.CooldownUntil, upstream.DefaultCooldownMax)
		}
	}

	capped := upstreamtest.Start(t,
		upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "31536000"}}},
		upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader}, Body: upstreamtest.ChatCompletion("ok")})
	h = startProxy(t, capped.URL, func(o *Options) { o.Upstreams[0].Cooldown.Max = 300 * time.Millisecond })
	if resp, _ := h.chat(""); resp.StatusCode != 429 {
		t.Fatalf("the year-long 429: %d", resp.StatusCode)
	}
	if resp, body := h.chat(""); resp.StatusCode != 200 { // waits the capped cooldown out (no fallback)
		t.Fatalf("after the capped cooldown: %d %s", resp.StatusCode, body)
	}
	if n := capped.Count(); n != 2 {
		t.Fatalf("the upstream saw %d requests, want 2", n)
	}
}
