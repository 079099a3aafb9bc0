//go:build external

package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"sturdy/internal/redistest"
	"sturdy/policy"
)

// TestTokensMatchTheLocalWindow: the fleet's budget answers a sequence
// of reservations, settlements and refunds as policy.TokenWindow does
// (within one slot: the script and the window read different clocks).
func TestTokensMatchTheLocalWindow(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	var w policy.TokenWindow
	w.SetLimit(100)
	ctx := context.Background()
	for i, step := range []struct {
		n, used int64 // used < 0: refunded
	}{{30, 40}, {30, -1}, {30, 30}, {20, 0}, {40, 40}, {200, 0}, {1, 1}} {
		now := time.Now()
		ok, _ := w.Reserve(step.n, now)
		want := w.State(now)
		h, taken, wait, remaining, reserved, err := s.ReserveTokens("b", 100, step.n)
		if err != nil {
			t.Fatal(err)
		}
		if taken != ok || remaining != want.Remaining || reserved != want.Reserved {
			t.Fatalf("step %d: fleet taken %v remaining %d reserved %d (wait %v), local %v %+v", i, taken, remaining, reserved, wait, ok, want)
		}
		if !ok {
			if wait < 55*time.Second || wait > 65*time.Second {
				t.Fatalf("step %d: wait %v, want the minute's end", i, wait)
			}
			continue
		}
		used := max(step.used, 0)
		if step.used < 0 {
			w.Refund(step.n)
		} else {
			w.Settle(step.n, used, now)
		}
		if err := s.settleTokens(ctx, h, used); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := s.rdb.Keys(ctx, "t:tokens:*").Result()
	if err != nil || len(keys) != 1 || strings.Contains(keys[0], "secret") {
		t.Fatalf("keys %v %v", keys, err)
	}
}

// TestTheFleetCountsItsReplicas: two replicas on one Redis each count
// two within a beat.
func TestTheFleetCountsItsReplicas(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	a := start(t, r.URL, Hooks{})
	b, err := New(Config{URL: r.URL, Prefix: "t:", Timeout: 200 * time.Millisecond}, zerolog.Nop(), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for end := time.Now().Add(2 * replicaBeat); (a.Replicas() != 2 || b.Replicas() != 2) && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	if a.Replicas() != 2 || b.Replicas() != 2 {
		t.Fatalf("replicas %d and %d, want 2", a.Replicas(), b.Replicas())
	}
	b.Close() // leaves the membership at once
	if n, err := a.rdb.ZCard(context.Background(), "t:replicas").Result(); err != nil || n != 1 {
		t.Fatalf("after a replica closed the membership holds %d (%v)", n, err)
	}
}

// TestAReservationOfNothingSettles: a request that reserved 0 tokens (no
// text, an input budget) settles what it used, and Redis stays up.
func TestAReservationOfNothingSettles(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	h, taken, _, _, _, err := s.ReserveTokens("zero", 100, 0)
	if err != nil || !taken {
		t.Fatalf("reserve 0: %v %v", taken, err)
	}
	if err := s.settleTokens(context.Background(), h, 50); err != nil {
		t.Fatalf("settle: %v", err)
	}
	if _, _, _, remaining, _, err := s.ReserveTokens("zero", 100, 0); err != nil || remaining != 50 || !s.Up() {
		t.Fatalf("after settling 50: remaining %d, %v, up %v", remaining, err, s.Up())
	}
}
