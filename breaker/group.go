package breaker

import (
	"container/list"
	"strings"
	"sync"
	"time"
)

// GroupSettings configures a Group. A zero field means its default.
type GroupSettings struct {
	// Breaker is every member's settings (OnStateChange gets the member's
	// name: the group's name, a slash, the key).
	Breaker Settings
	// Max caps the members; past it the least recently used goes.
	// Default 256.
	Max int
	// IdleFor is how long a member unused is kept. Default 10 minutes.
	IdleFor time.Duration
}

// Defaults of GroupSettings.
const (
	DefaultGroupMax     = 256
	DefaultGroupIdleFor = 10 * time.Minute
)

// Group is a bounded set of breakers by key (an upstream's breakers per
// model): a member is made on first use, the least recently used goes
// past Max, and one unused for IdleFor is dropped. Keys come from
// clients, so nothing they send can grow it without bound. It is safe for
// concurrent use.
type Group struct {
	name  string
	s     GroupSettings
	mu    sync.Mutex
	byKey map[string]*list.Element
	lru   *list.List // front: most recently used
}

// Member is a breaker of a Group, with its key.
type Member struct {
	*Breaker
	Key  string
	used time.Time
}

// NewGroup returns an empty group named name.
func NewGroup(name string, s GroupSettings) *Group {
	if s.Max <= 0 {
		s.Max = DefaultGroupMax
	}
	if s.IdleFor <= 0 {
		s.IdleFor = DefaultGroupIdleFor
	}
	return &Group{name: name, s: s, byKey: map[string]*list.Element{}, lru: list.New()}
}

// Get returns key's breaker, made closed on first use, as used at now.
func (g *Group) Get(key string, now time.Time) *Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.byKey[key]; ok {
		m := e.Value.(*Member)
		if now.Sub(m.used) <= g.s.IdleFor {
			m.used = now
			g.lru.MoveToFront(e)
			return m
		}
		g.remove(e) // idle too long: start afresh
	}
	for g.lru.Len() >= g.s.Max {
		g.remove(g.lru.Back())
	}
	g.sweep(now)
	key = strings.Clone(key) // it may point into a request's bytes
	m := &Member{Breaker: New(g.name+"/"+key, g.s.Breaker), Key: key, used: now}
	g.byKey[key] = g.lru.PushFront(m)
	return m
}

// sweep drops the members unused for IdleFor (from the back, oldest first).
func (g *Group) sweep(now time.Time) {
	for e := g.lru.Back(); e != nil && now.Sub(e.Value.(*Member).used) > g.s.IdleFor; e = g.lru.Back() {
		g.remove(e)
	}
}

func (g *Group) remove(e *list.Element) {
	delete(g.byKey, e.Value.(*Member).Key)
	g.lru.Remove(e)
}

// Peek returns key's breaker if the group has one, without making or
// touching it.
func (g *Group) Peek(key string) *Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.byKey[key]; ok {
		return e.Value.(*Member)
	}
	return nil
}

// Members returns the members, most recently used first.
func (g *Group) Members() []*Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*Member, 0, g.lru.Len())
	for e := g.lru.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(*Member))
	}
	return out
}
