package fleet

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// follow receives the fleet's events until ctx ends. Every time the
// subscription (re)opens — at start and after each reconnect, when
// Pub/Sub has dropped whatever was published meanwhile — it loads the
// cooldowns in force.
func (s *State) follow(ctx context.Context) {
	defer s.done.Done()
	defer s.recovered("subscribe")
	backoff := 100 * time.Millisecond
	pause := func() {
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	ps := s.ps.Load()
	for ctx.Err() == nil {
		if err := ps.Subscribe(ctx, s.channel()); err != nil { // at start, and until it first works
			s.result("subscribe", err)
			pause()
			continue
		}
		break
	}
	for ctx.Err() == nil {
		msg, err := receive(ctx, ps)
		if ctx.Err() != nil {
			return // closed
		}
		if errors.Is(err, errBadReply) { // the connection's replies cannot be trusted: a new one
			s.log.Warn().Msg("shared state: Redis sent a pub/sub reply of a shape Sturdy does not read; subscribing anew")
			s.result("subscribe", err)
			pause()
			if ps = s.resubscribe(ctx, ps); ps == nil {
				return
			}
			continue
		}
		if err != nil {
			s.result("subscribe", err)
			pause() // go-redis reconnects on the next Receive
			continue
		}
		backoff = 100 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				s.result("subscribe", nil) // (re)connected
				s.loadCooldowns(ctx)
			}
		case *redis.Message:
			s.result("subscribe", nil) // Redis answers
			s.event(m.Payload)
		}
	}
}

// errBadReply is a pub/sub reply go-redis could not read: an empty
// array, a message without its payload, a number where its kind goes. It
// is a failed call, and the subscription opens anew.
var errBadReply = errors.New("redis: a pub/sub reply of a shape Sturdy does not read")

// receive is ps.Receive, with the panic go-redis raises on a reply of a
// shape it does not check (its size the guard bounds) turned into
// errBadReply. go-redis reads the reply whole, and releases its lock,
// before it panics.
func receive(ctx context.Context, ps *redis.PubSub) (msg any, err error) {
	defer func() {
		if r := recover(); r != nil {
			msg, err = nil, errBadReply
		}
	}()
	return ps.Receive(ctx)
}

// resubscribe closes old and subscribes anew on a new connection, until
// that works or ctx ends (nil then). Close closes whichever is current.
func (s *State) resubscribe(ctx context.Context, old *redis.PubSub) *redis.PubSub {
	ps := s.rdb.Subscribe(ctx)
	s.ps.Store(ps)
	_ = old.Close()
	if ctx.Err() != nil { // Close may have closed old, not ps
		_ = ps.Close()
		return nil
	}
	for backoff := 100 * time.Millisecond; ctx.Err() == nil; backoff = min(2*backoff, 5*time.Second) {
		err := ps.Subscribe(ctx, s.channel())
		if err == nil {
			return ps
		}
		s.result("subscribe", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
	return nil
}

// recovered ends a panic in one of the fleet's goroutines as a failed
// call of op: logged with its stack and counted (Hooks.Panicked). The
// goroutine ends; the process serves on.
func (s *State) recovered(op string) {
	r := recover()
	if r == nil {
		return
	}
	s.log.Error().Str("component", "fleet").Str("op", op).Str("panic", fmt.Sprint(r)).Bytes("stack", debug.Stack()).
		Msg("recovered a panic; the process serves on")
	s.result(op, errBadReply)
	if s.hooks.Panicked != nil {
		s.hooks.Panicked()
	}
}

// loadPage is how many keys one SCAN step asks Redis for (its COUNT),
// and at most how many one MGET reads; a load reads at most loadPages
// pages within loadTime (COUNT is only a hint, and a cursor may never
// come back to 0).
const (
	loadPage  = 1000
	loadPages = 10_000
	loadTime  = time.Minute
)

// loadCooldowns reads the cooldowns in force from Redis, a page at a
// time (SCAN … COUNT, then MGET of at most loadPage keys), and hands the
// proxy at most MaxCooldowns of them; those it adopted shorter are
// shortened in Redis, a page's in one pipeline. Neither a fleet's keys
// nor a hostile Redis can make a (re)connect hold, adopt or ask more.
func (s *State) loadCooldowns(ctx context.Context) {
	if s.hooks.Cooldown == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, loadTime)
	defer cancel()
	prefix := s.cfg.Prefix + "cooldown:"
	adopted := 0
	cursor := uint64(0)
	for page := 0; page < loadPages && adopted < s.cfg.MaxCooldowns; page++ {
		keys, next, err := s.rdb.Scan(ctx, cursor, prefix+"*", loadPage).Result()
		for len(keys) > 0 && err == nil && adopted < s.cfg.MaxCooldowns {
			batch := keys[:min(len(keys), loadPage, s.cfg.MaxCooldowns-adopted)]
			keys = keys[len(batch):]
			var vals []any
			if vals, err = s.rdb.MGet(ctx, batch...).Result(); err != nil {
				break
			}
			var shorter []Cooldown
			for i := 0; i < len(vals) && i < len(batch); i++ {
				str, ok := vals[i].(string)
				name := strings.TrimPrefix(batch[i], prefix)
				cut := strings.LastIndexByte(name, ':')
				if !ok || cut < 0 {
					continue
				}
				until, streak, _ := strings.Cut(str, ":")
				c, in, shortened := s.cooldown(name[:cut], name[cut+1:], until, streak)
				if in {
					adopted++
				}
				if shortened {
					shorter = append(shorter, c)
				}
			}
			err = s.shortenAll(ctx, shorter)
		}
		s.result("load_cooldowns", err)
		if err != nil || next == 0 {
			return
		}
		cursor = next
	}
}

// event handles one published event: "c|upstream|key|untilMs|streak" or
// "b|upstream|endpoint|untilMs". Upstream names never hold "|" (config
// names are plain); an event that does not parse is dropped.
func (s *State) event(payload string) {
	f := strings.Split(payload, "|")
	switch {
	case len(f) == 5 && f[0] == "c":
		if c, _, shortened := s.cooldown(f[1], f[2], f[3], f[4]); shortened {
			s.background("shorten_cooldown", func(ctx context.Context) error { return s.shortenAll(ctx, []Cooldown{c}) })
		}
	case len(f) == 4 && f[0] == "b" && s.cfg.ShareBreakers && s.hooks.BreakerOpened != nil:
		if ms, err := strconv.ParseInt(f[3], 10, 64); err == nil {
			s.hooks.BreakerOpened(f[1], f[2], time.UnixMilli(ms))
		}
	}
}

// cooldown hands a cooldown read from Redis to the proxy: in says it was
// one in force; shortened that the proxy adopted it shorter (c holds the
// end adopted), for the caller to write back to Redis.
func (s *State) cooldown(upstream, key, untilMs, streak string) (c Cooldown, in, shortened bool) {
	var k Key
	ms, err1 := strconv.ParseInt(untilMs, 10, 64)
	n, err2 := strconv.Atoi(streak)
	if b, err := hex.DecodeString(key); err != nil || len(b) != len(k) || err1 != nil || err2 != nil || s.hooks.Cooldown == nil {
		return c, false, false
	} else {
		copy(k[:], b)
	}
	c = Cooldown{Upstream: upstream, Key: k, Until: time.UnixMilli(ms), Streak: n}
	if !c.Until.After(time.Now()) {
		return c, false, false
	}
	adopted := s.hooks.Cooldown(c)
	if adopted.Before(c.Until) {
		c.Until = adopted
		return c, true, true
	}
	return c, true, false
}
