package fleet

import (
	"context"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

// reserve is GCRA with a reservation, one round trip and atomic: KEYS[1]
// holds the theoretical arrival time (µs, Redis's clock); ARGV the
// emission interval (µs), the burst and the longest wait (µs). It
// returns {taken, delay µs}: taken when the wait is within the longest,
// and then the slot is the caller's (as rate.Limiter.Reserve's is).
var reserve = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new = tat + interval
local delay = new - now - burst * interval
if delay < 0 then delay = 0 end
if delay > tonumber(ARGV[3]) then return {0, delay} end
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1000)
return {1, delay}`)

// Reserve takes one slot of the fleet-wide limit name — rate per second,
// burst — if it comes within maxWait (0: now or never), and returns the
// wait before it (or, not taken, until one would come). err means Redis
// did not answer within the timeout: the caller decides (on_failure).
func (s *State) Reserve(name string, rate float64, burst int, maxWait time.Duration) (delay time.Duration, taken bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	interval := math.Max(1, 1e6/rate)
	r, err := reserve.Run(ctx, s.rdb, []string{s.cfg.Prefix + "limit:" + name}, interval, burst, maxWait.Microseconds()).Int64Slice()
	s.result("reserve", err)
	if err != nil {
		return 0, false, err
	}
	if len(r) != 2 {
		return 0, false, redis.Nil
	}
	return time.Duration(r[1]) * time.Microsecond, r[0] == 1, nil
}
