package breaker

import (
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// GroupSettings configures a Group. A zero field means its default.
type GroupSettings struct {
	// Breaker is every member's settings; its OnStateChange is not used
	// (see OnStateChange here).
	Breaker Settings
	// OnStateChange, if set, is called on every member's transition with
	// the member's key. It runs under the member's lock.
	OnStateChange func(key string, from, to State)
	// OnEvict, if set, is called when a member is dropped to make room
	// for another (Max), not when one is dropped for being idle. It runs
	// under the group's lock.
	OnEvict func()
	// Max caps the members; past it the least recently used goes.
	// Default 256.
	Max int
	// IdleFor is how long a member unused is kept. Default 10 minutes.
	IdleFor time.Duration
	// SweepEvery is how often, while the group has members, those idle
	// past IdleFor are dropped by a timer (whether or not new keys
	// arrive). Default 1 minute.
	SweepEvery time.Duration
}

// Defaults of GroupSettings.
const (
	DefaultGroupMax        = 256
	DefaultGroupIdleFor    = 10 * time.Minute
	DefaultGroupSweepEvery = time.Minute
)

// Group is a bounded set of breakers by key (an endpoint's breakers per
// model): a member is made on first use, the least recently used goes
// past Max, and one unused for IdleFor is dropped — at its next use, or
// by the sweep timer. Keys come from clients: a member keeps one copy of
// its key (the map's and the member's are the same string), so the
// caller bounds what a key may cost (the proxy passes policy.ModelKey).
// It is safe for concurrent use.
type Group struct {
	name string
	s    GroupSettings
	mu   sync.Mutex
	lru  *simplelru.LRU[string, *Member] // oldest: least recently used
	// sweep is the idle sweep's timer, armed while the group has members.
	sweep *time.Timer
}

// Member is a breaker of a Group, with its key.
type Member struct {
	*Breaker
	Key  string
	used time.Time
}

// NewGroup returns an empty group named name (each member's breaker is
// named so too: a key is kept once, in the member).
func NewGroup(name string, s GroupSettings) *Group {
	if s.Max <= 0 {
		s.Max = DefaultGroupMax
	}
	if s.IdleFor <= 0 {
		s.IdleFor = DefaultGroupIdleFor
	}
	if s.SweepEvery <= 0 {
		s.SweepEvery = DefaultGroupSweepEvery
	}
	s.Breaker.OnStateChange = nil
	lru, _ := simplelru.NewLRU[string, *Member](s.Max, nil) // cannot fail: Max > 0
	return &Group{name: name, s: s, lru: lru}
}

// Get returns key's breaker, made closed on first use, as used at now.
func (g *Group) Get(key string, now time.Time) *Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m, ok := g.lru.Get(key); ok {
		if now.Sub(m.used) <= g.s.IdleFor {
			m.used = now
			return m
		}
		g.lru.Remove(key) // idle too long: start afresh
	}
	g.dropIdle(now)
	key = strings.Clone(key) // it may point into a request's bytes
	bs := g.s.Breaker
	if f := g.s.OnStateChange; f != nil {
		bs.OnStateChange = func(_ string, from, to State) { f(key, from, to) }
	}
	m := &Member{Breaker: New(g.name, bs), Key: key, used: now}
	if g.lru.Add(key, m) && g.s.OnEvict != nil {
		g.s.OnEvict()
	}
	if g.sweep == nil {
		g.sweep = time.AfterFunc(g.s.SweepEvery, g.sweepIdle)
	}
	return m
}

// dropIdle drops the members unused for IdleFor, oldest first; under mu.
func (g *Group) dropIdle(now time.Time) {
	for {
		k, m, ok := g.lru.GetOldest()
		if !ok || now.Sub(m.used) <= g.s.IdleFor {
			return
		}
		g.lru.Remove(k)
	}
}

// sweepIdle is the sweep timer's: it drops idle members and re-arms
// itself while members are left.
func (g *Group) sweepIdle() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropIdle(time.Now())
	if g.lru.Len() == 0 {
		g.sweep = nil
		return
	}
	g.sweep.Reset(g.s.SweepEvery)
}

// Peek returns key's breaker if the group has one, without making or
// touching it.
func (g *Group) Peek(key string) *Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, _ := g.lru.Peek(key)
	return m
}

// Len returns the number of members.
func (g *Group) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lru.Len()
}

// Members returns up to n members (all when n ≤ 0), most recently used
// first.
func (g *Group) Members(n int) []*Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	all := g.lru.Values() // oldest first
	if n <= 0 || n > len(all) {
		n = len(all)
	}
	out := make([]*Member, 0, n)
	for i := len(all) - 1; i >= 0 && len(out) < n; i-- {
		out = append(out, all[i])
	}
	return out
}
