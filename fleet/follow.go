package fleet

import (
	"context"
	"encoding/hex"
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
	ps := s.ps
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		if err := ps.Subscribe(ctx, s.channel()); err != nil { // at start, and until it first works
			s.result("subscribe", err)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		break
	}
	for ctx.Err() == nil {
		msg, err := ps.Receive(ctx)
		if ctx.Err() != nil {
			return // closed
		}
		if err != nil {
			s.result("subscribe", err)
			select { // go-redis reconnects on the next Receive
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
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

// loadPage is how many keys one SCAN step asks Redis for (its COUNT),
// and so how many one MGET reads.
const loadPage = 1000

// loadCooldowns reads the cooldowns in force from Redis, a page at a
// time (SCAN … COUNT, then MGET of the page), and hands the proxy at most
// MaxCooldowns of them: neither a fleet's keys nor a hostile Redis can
// make a (re)connect hold or adopt more.
func (s *State) loadCooldowns(ctx context.Context) {
	if s.hooks.Cooldown == nil {
		return
	}
	prefix := s.cfg.Prefix + "cooldown:"
	adopted := 0
	for cursor := uint64(0); ; {
		keys, next, err := s.rdb.Scan(ctx, cursor, prefix+"*", loadPage).Result()
		if err == nil && len(keys) > 0 {
			var vals []any
			vals, err = s.rdb.MGet(ctx, keys...).Result()
			for i := 0; err == nil && i < len(vals) && i < len(keys) && adopted < s.cfg.MaxCooldowns; i++ {
				str, ok := vals[i].(string)
				name := strings.TrimPrefix(keys[i], prefix)
				cut := strings.LastIndexByte(name, ':')
				if !ok || cut < 0 {
					continue
				}
				until, streak, _ := strings.Cut(str, ":")
				if s.cooldown(name[:cut], name[cut+1:], until, streak) {
					adopted++
				}
			}
		}
		s.result("load_cooldowns", err)
		if err != nil || next == 0 || adopted >= s.cfg.MaxCooldowns {
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
		s.cooldown(f[1], f[2], f[3], f[4])
	case len(f) == 4 && f[0] == "b" && s.cfg.ShareBreakers && s.hooks.BreakerOpened != nil:
		if ms, err := strconv.ParseInt(f[3], 10, 64); err == nil {
			s.hooks.BreakerOpened(f[1], f[2], time.UnixMilli(ms))
		}
	}
}

// cooldown hands a cooldown read from Redis to the proxy and reports
// whether it was one in force; a cooldown the proxy adopted shorter is
// shortened in Redis too.
func (s *State) cooldown(upstream, key, untilMs, streak string) bool {
	var k Key
	ms, err1 := strconv.ParseInt(untilMs, 10, 64)
	n, err2 := strconv.Atoi(streak)
	if b, err := hex.DecodeString(key); err != nil || len(b) != len(k) || err1 != nil || err2 != nil || s.hooks.Cooldown == nil {
		return false
	} else {
		copy(k[:], b)
	}
	until := time.UnixMilli(ms)
	if !until.After(time.Now()) {
		return false
	}
	if adopted := s.hooks.Cooldown(Cooldown{Upstream: upstream, Key: k, Until: until, Streak: n}); adopted.Before(until) {
		s.shorten(upstream, k, adopted)
	}
	return true
}
