//go:build external

package proxy

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"sturdy/internal/redistest"
	"sturdy/internal/upstreamtest"
)

// spentInRedis sums what the fleet's token budgets under prefix t: hold
// as spent, once no reservation or lease is left holding any (settlements
// go in the background, a lease's a flush later), waiting up to 4 s; and
// every key and value, to look for secrets in.
func spentInRedis(t *testing.T, url string, want int64) (all string) {
	t.Helper()
	o, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(o)
	defer rdb.Close()
	ctx := context.Background()
	var spent int64
	for end := time.Now().Add(4 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		keys, err := rdb.Keys(ctx, "t:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		spent, all = 0, strings.Join(keys, " ")
		held := false
		for _, k := range keys {
			if !strings.HasPrefix(k, "t:tokens:") {
				continue
			}
			h, _ := rdb.HGetAll(ctx, k).Result()
			for f, v := range h {
				n, _ := strconv.ParseInt(v, 10, 64)
				all += " " + f + "=" + v
				switch f[0] {
				case 's':
					spent += n
				case 'r':
					held = held || n > 0
				case 'l':
					held = true
				}
			}
		}
		if spent == want && !held || time.Now().After(end) {
			break
		}
	}
	if spent != want {
		t.Fatalf("the fleet's budgets hold %d spent, want %d: %s", spent, want, all)
	}
	return all
}

// budgetFleet is two replicas sharing a Redis in front of an upstream
// whose replies use in and out tokens, edit applied to each (their Redis
// timeout 500 ms: a loaded machine's Redis is no test of a budget).
func budgetFleet(t *testing.T, in, out int, edit func(*Options)) (*redistest.Server, []*harness) {
	r := redistest.Start(t)
	up := upstreamtest.Start(t, chatUsage(in, out))
	return r, fleetOf(t, 2, up.URL, r.URL, func(o *Options) {
		o.SharedState.Timeout = 500 * time.Millisecond
		edit(o)
	})
}

// TestTwoReplicasHoldOneTokenBudget: a client's budget is the fleet's —
// two replicas together admit what one would (per-replica counters would
// admit twice the limit: LiteLLM #40291) — and Redis holds hashes, never
// the credential.
func TestTwoReplicasHoldOneTokenBudget(t *testing.T) {
	t.Parallel()
	r, hs := budgetFleet(t, 10, 50, func(o *Options) {
		o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: 100}}}
	})
	const key = "Bearer sk-secret-0123456789"
	var codes []int
	for i := range 4 { // 21 fits 0 and 60 spent: two go, then 120 is spent
		resp, _ := hs[i%2].chat(asking(20, false), "Authorization", key)
		codes = append(codes, resp.StatusCode)
		spentInRedis(t, r.URL, int64(60*min(i+1, 2)))
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 || codes[3] != 429 {
		t.Fatalf("statuses %v", codes)
	}
	if all := spentInRedis(t, r.URL, 120); strings.Contains(all, "sk-secret") || strings.Contains(all, "0123456789") {
		t.Fatalf("Redis holds the credential: %s", all)
	}
}

// TestTwoReplicasLeaseALargeTokenBudget: a budget large enough to lease
// (fleet.MinTokenLease) is reserved and settled through two replicas'
// leases — a call per many requests, not two per request — and what the
// fleet's window holds once they flushed is exactly what the replies used.
func TestTwoReplicasLeaseALargeTokenBudget(t *testing.T) {
	t.Parallel()
	r, hs := budgetFleet(t, 100, 900, func(o *Options) {
		o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: 1_000_000}}}
	})
	const requests = 100
	calls := r.ScriptCalls()
	for i := range requests {
		if resp, body := hs[i%2].chat(asking(999, false), "Authorization", "Bearer sk-lease"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	calls = r.ScriptCalls() - calls
	t.Logf("%d requests, %d script calls", requests, calls)
	if calls*5 > requests {
		t.Fatalf("%d requests made %d script calls, want at most one per five", requests, calls)
	}
	for _, h := range hs { // a replica that stops gives its lease back and settles its spend as it does, not a flush later
		if err := h.p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	o, _ := redis.ParseURL(r.URL)
	rdb := redis.NewClient(o)
	defer rdb.Close()
	keys, _ := rdb.Keys(context.Background(), "t:tokens:*").Result()
	var spent int64
	for _, k := range keys {
		f, _ := rdb.HGetAll(context.Background(), k).Result()
		for field, v := range f {
			n, _ := strconv.ParseInt(v, 10, 64)
			switch field[0] {
			case 's':
				spent += n
			case 'l', 'r': // a lease's field holding none stays until its deadline
				if n != 0 || field[0] == 'l' && !strings.HasPrefix(v, "0:") {
					t.Fatalf("after the replicas stopped %s still holds %s=%s", k, field, v)
				}
			}
		}
	}
	if spent != requests*1_000 {
		t.Fatalf("after the replicas stopped the window holds %d, want %d", spent, requests*1_000)
	}
}

// TestRedisDownDividesATokenBudgetByTheReplicas: with Redis gone and
// on_failure local, each replica holds the budget ÷ the replicas the
// fleet last counted (two: 50 of 100).
func TestRedisDownDividesATokenBudgetByTheReplicas(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	up := upstreamtest.Start(t, chatUsage(10, 50))
	hs := fleetOf(t, 2, up.URL, r.URL, func(o *Options) {
		o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: 100}}}
	})
	for end := time.Now().Add(10 * time.Second); hs[0].p.fleet.Load().st.Replicas() != 2 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	if n := hs[0].p.fleet.Load().st.Replicas(); n != 2 {
		t.Fatalf("the fleet counts %d replicas", n)
	}
	r.Kill()
	var codes []int
	for range 2 { // 21 fits 50 with nothing spent; 60 spent leaves no room (it would in 100)
		resp, _ := hs[0].chat(asking(20, false), "Authorization", "Bearer k")
		codes = append(codes, resp.StatusCode)
	}
	if codes[0] != 200 || codes[1] != 429 {
		t.Fatalf("statuses %v with Redis down", codes)
	}
}

// TestTwoReplicasPaceOneUpstreamTokensPerMinute: an upstream's
// tokens_per_minute is the fleet's too.
func TestTwoReplicasPaceOneUpstreamTokensPerMinute(t *testing.T) {
	t.Parallel()
	r, hs := budgetFleet(t, 10, 50, func(o *Options) {
		o.Upstreams[0].TokensPerMinute = map[string]int64{"*": 100}
	})
	var codes []int
	for i := range 3 {
		resp, _ := hs[i%2].chat(asking(20, false))
		codes = append(codes, resp.StatusCode)
		spentInRedis(t, r.URL, int64(60*min(i+1, 2)))
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("statuses %v", codes)
	}
}

// TestTwoReplicasHoldOneSpendBudget: what a client spent through one
// replica counts on the other (in Redis, by the credential's hash).
func TestTwoReplicasHoldOneSpendBudget(t *testing.T) {
	t.Parallel()
	r, hs := budgetFleet(t, 10, 50, func(o *Options) { // $1.10 at m's price
		o.Prices = map[string]Price{"m": {Input: 10000, Output: 20000}}
		o.Clients = []ClientLimit{{Spend: Spend{USD: 1, Period: "month"}}}
	})
	if resp, body := hs[0].chat(asking(20, false), "Authorization", "Bearer sk-spender"); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	o, _ := redis.ParseURL(r.URL)
	rdb := redis.NewClient(o)
	defer rdb.Close()
	var keys []string
	for end := time.Now().Add(2 * time.Second); len(keys) == 0 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		keys, _ = rdb.Keys(context.Background(), "t:spend:*").Result()
	}
	if len(keys) != 1 || strings.Contains(keys[0], "sk-spender") {
		t.Fatalf("spend keys %v", keys)
	}
	resp, body := hs[1].chat(asking(20, false), "Authorization", "Bearer sk-spender")
	if code, _ := errorOf(t, body); resp.StatusCode != 429 || code != CodeBudgetExceeded {
		t.Fatalf("the other replica: %d %s", resp.StatusCode, body)
	}
}

// TestARedisOutageKeepsTheSpendItSaw: a replica keeps its own spend of
// a fleet's budget in its local window, so when Redis goes (on_failure
// local) the minute goes on from what was spent, not from zero. Before,
// each budget restarted empty: 1.9× the budget in the outage's minute.
func TestARedisOutageKeepsTheSpendItSaw(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	up := upstreamtest.Start(t, chatUsage(10, 80))
	hs := fleetOf(t, 1, up.URL, r.URL, func(o *Options) {
		o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: 100}}}
	})
	if resp, body := hs[0].chat(asking(20, false), "Authorization", "Bearer k"); resp.StatusCode != 200 { // 90 spent
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	spentInRedis(t, r.URL, 90)
	r.Kill()
	if resp, _ := hs[0].chat(asking(20, false), "Authorization", "Bearer k"); resp.StatusCode != 429 { // 21 on 90 of 100 spent: refused
		t.Fatalf("with Redis down the next request got %d: its budget started from zero", resp.StatusCode)
	}
}
