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

// loadCooldowns reads every cooldown in force from Redis.
func (s *State) loadCooldowns(ctx context.Context) {
	if s.hooks.Cooldown == nil {
		return
	}
	prefix := s.cfg.Prefix + "cooldown:"
	iter := s.rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		s.result("load_cooldowns", err)
		return
	}
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 500)]
		keys = keys[len(batch):]
		vals, err := s.rdb.MGet(ctx, batch...).Result()
		s.result("load_cooldowns", err)
		if err != nil {
			return
		}
		for i, v := range vals {
			str, ok := v.(string)
			name := strings.TrimPrefix(batch[i], prefix)
			cut := strings.LastIndexByte(name, ':')
			if !ok || cut < 0 {
				continue
			}
			until, streak, _ := strings.Cut(str, ":")
			s.cooldown(name[:cut], name[cut+1:], until, streak)
		}
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

// cooldown hands a cooldown read from Redis to the proxy.
func (s *State) cooldown(upstream, key, untilMs, streak string) {
	var k Key
	ms, err1 := strconv.ParseInt(untilMs, 10, 64)
	n, err2 := strconv.Atoi(streak)
	if b, err := hex.DecodeString(key); err != nil || len(b) != len(k) || err1 != nil || err2 != nil || s.hooks.Cooldown == nil {
		return
	} else {
		copy(k[:], b)
	}
	if until := time.UnixMilli(ms); until.After(time.Now()) {
		s.hooks.Cooldown(Cooldown{Upstream: upstream, Key: k, Until: until, Streak: n})
	}
}
