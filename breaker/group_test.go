package breaker

import (
	"fmt"
	"testing"
	"time"
)

func TestGroupIsBoundedAndForgetsIdleMembers(t *testing.T) {
	now := time.Unix(1_000, 0)
	evicted := 0
	g := NewGroup("up", GroupSettings{Max: 3, IdleFor: time.Minute, Breaker: Settings{ConsecutiveFailures: 1},
		OnEvict: func() { evicted++ }})
	a := g.Get("a", now)
	if g.Get("a", now) != a {
		t.Fatal("the same key gave another breaker")
	}
	ticket, _ := a.Allow()
	ticket.Done(Failure)
	if a.State() != StateOpen {
		t.Fatal("a did not open")
	}
	if b := g.Get("b", now); b.State() != StateClosed {
		t.Fatal("another key shares a's breaker")
	}
	for i := 0; i < 10; i++ {
		g.Get(fmt.Sprint("k", i), now.Add(time.Second))
	}
	if n := len(g.Members(0)); n != 3 || evicted != 9 {
		t.Fatalf("%d members (%d evicted), want the cap 3 (9 evicted)", n, evicted)
	}
	if ms := g.Members(2); len(ms) != 2 || ms[0].Key != "k9" || ms[1].Key != "k8" {
		t.Fatalf("Members(2) is not the two most recently used: %v", ms)
	}
	if g.Get("a", now.Add(2*time.Second)) == a {
		t.Fatal("the least recently used member was not evicted")
	}
	c := g.Get("c", now.Add(3*time.Second))
	if g.Get("c", now.Add(3*time.Second+2*time.Minute)) == c {
		t.Fatal("a member idle past IdleFor was kept")
	}
}

// TestGroupSweepsIdleMembersByItself: members unused past IdleFor go by
// the sweep timer, with no new key arriving (a flood of distinct models
// would otherwise stay until the next one).
func TestGroupSweepsIdleMembersByItself(t *testing.T) {
	t.Parallel()
	g := NewGroup("up", GroupSettings{IdleFor: 20 * time.Millisecond, SweepEvery: 10 * time.Millisecond})
	for i := 0; i < 100; i++ {
		g.Get(fmt.Sprint("model-", i), time.Now())
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.Len() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle members still kept", g.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The timer re-arms for members made after it stopped.
	g.Get("again", time.Now())
	for g.Len() > 0 {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatal("a member made after the sweep stopped is never swept")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGroupReportsTransitionsWithTheKey: OnStateChange gets the member's
// key (the breaker's name is the group's: the key is kept once).
func TestGroupReportsTransitionsWithTheKey(t *testing.T) {
	var got []string
	g := NewGroup("up", GroupSettings{Breaker: Settings{ConsecutiveFailures: 1},
		OnStateChange: func(key string, _, to State) { got = append(got, key+"→"+to.String()) }})
	tk, _ := g.Get("gpt-4o", time.Now()).Allow()
	tk.Done(Failure)
	if len(got) != 1 || got[0] != "gpt-4o→open" {
		t.Fatalf("transitions %v", got)
	}
}
