package breaker

import (
	"fmt"
	"testing"
	"time"
)

func TestGroupIsBoundedAndForgetsIdleMembers(t *testing.T) {
	now := time.Unix(1_000, 0)
	g := NewGroup("up", GroupSettings{Max: 3, IdleFor: time.Minute, Breaker: Settings{ConsecutiveFailures: 1}})
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
	if n := len(g.Members()); n != 3 {
		t.Fatalf("%d members, want the cap 3", n)
	}
	if g.Get("a", now.Add(2*time.Second)) == a {
		t.Fatal("the least recently used member was not evicted")
	}
	c := g.Get("c", now.Add(3*time.Second))
	if g.Get("c", now.Add(3*time.Second+2*time.Minute)) == c {
		t.Fatal("a member idle past IdleFor was kept")
	}
}
