package fleet

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A fleet's token budget is one Redis hash per budget (KEYS[1]): the
// tokens spent in each 5 s slot of the sliding minute ("s<slot>", 13 of
// them: spend leaves it 60–65 s after, as policy.TokenWindow's does), and
// the tokens reserved by requests in flight, by the minute they were
// reserved in ("r<minute>"). A reservation is taken back when its request
// settles; one never settled (its replica died, or its caller stopped
// waiting for the reply) is dropped after five minutes — the scripts' 5
// — and so is a stream's that runs longer (its spend still counts as it
// settles). A replica's lease of the budget (tokenlease.go) is one more
// field, "l<replica>", holding its tokens until a deadline it renews. The
// hash is dropped six minutes (360000 ms) after its last write.

// tokenWindow is the scripts' common start: it reads the budget's hash
// (KEYS[1]; ARGV[1] its limit) as it stands now — spent, the spend in
// the window's slots (slots), reserved, what requests in flight and the
// replicas' leases hold (a lease's field "l<lease>" holds
// "<tokens>:<deadline µs>:<its last call's number>:<the spend it has
// put in the window>"; self, the caller's own lease field, is not
// counted there but in own, ownSeq and ownFlushed) —
// dropping what has aged out; wait(need) is how long until need more
// tokens fit (µs; 0: the holds in flight keep them).
const tokenWindow = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local slot = math.floor(now / 5000000)
local minute = math.floor(now / 60000000)
local limit = tonumber(ARGV[1])
local h = redis.call('HGETALL', KEYS[1])
local spent, reserved, own, ownSeq, ownFlushed, slots = 0, 0, 0, -1, 0, {}
for i = 1, #h, 2 do
  local f, v = h[i], h[i + 1]
  local k, at = string.sub(f, 1, 1), tonumber(string.sub(f, 2))
  local held, deadline, seq, flushed = string.match(v, '^(%d+):(%d+):(%d+):(%d+)$')
  if k == 's' and at and at > slot - 13 then
    spent = spent + tonumber(v)
    slots[#slots + 1] = {at, tonumber(v)}
  elseif k == 'r' and at and at > minute - 5 then
    reserved = reserved + tonumber(v)
  elseif k == 'l' and held and tonumber(deadline) > now then
    if f == self then
      own, ownSeq, ownFlushed = tonumber(held), tonumber(seq), tonumber(flushed)
    else
      reserved = reserved + tonumber(held)
    end
  else
    redis.call('HDEL', KEYS[1], f)
  end
end
local function wait(need)
  local over = spent + reserved + need - limit
  if over > spent then return 0 end
  table.sort(slots, function(a, b) return a[1] < b[1] end)
  local freed = 0
  for _, s in ipairs(slots) do
    freed = freed + s[2]
    if freed >= over then return (s[1] + 13) * 5000000 - now end
  end
  return 65000000
end
`

// reserveTokens: ARGV limit, n. Returns {taken, wait µs (0: reservations
// in flight hold it), remaining, the minute reserved in, reserved by
// requests in flight}.
var reserveTokens = redis.NewScript(`local self = ''` + tokenWindow + `
local n = tonumber(ARGV[2])
local over = spent + reserved + n - limit
if n > limit then over = spent + reserved end
if over <= 0 then
  redis.call('HINCRBY', KEYS[1], 'r' .. minute, n)
  redis.call('PEXPIRE', KEYS[1], 360000)
  return {1, 0, limit - spent - reserved - n, minute, reserved + n}
end
return {0, wait(math.min(n, limit)), limit - spent - reserved, minute, reserved}`)

// settleTokens: ARGV the minute reserved in, reserved, used (0: a
// refund).
var settleTokens = redis.NewScript(`
local t = redis.call('TIME')
local slot = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 5000000)
local f, reserved = 'r' .. ARGV[1], tonumber(ARGV[2])
if reserved > 0 then
  local left = redis.call('HINCRBY', KEYS[1], f, -reserved)
  if left <= 0 then redis.call('HDEL', KEYS[1], f) end
end
if tonumber(ARGV[3]) > 0 then
  redis.call('HINCRBY', KEYS[1], 's' .. slot, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], 360000)
end
return 1`)

// TokenHold is a reservation of a fleet's token budget, to settle.
type TokenHold struct {
	Name     string
	Minute   int64
	Reserved int64
	lease    *tokenLease // reserved from this replica's lease (tokenlease.go)
}

// ReserveTokens reserves n tokens of the fleet's budget name (limit a
// minute) if it allows them now: taken, else wait until it would (0: the
// reservations in flight hold it); remaining is what is left of it, and
// reserved what requests in flight hold (this one's included, taken). err
// means Redis did not answer within the timeout: the caller decides
// (on_failure). A budget large enough to lease (tokenLeaseSize) is
// reserved from this replica's lease of it (tokenlease.go) when n is no
// more than the lease holds free at most; what is said of remaining and
// reserved is then said only when a call was made (not taken).
func (s *State) ReserveTokens(name string, limit, n int64) (hold TokenHold, taken bool, wait time.Duration, remaining, reserved int64, err error) {
	if most := tokenLeaseSize(limit); most > 0 && n <= most && !s.closed.Load() {
		if l := s.tokenLeaseOf(name); l != nil {
			a, err := l.reserveLeased(n, limit)
			if !errors.Is(err, errLeaseEnded) {
				return a.hold, a.taken, a.wait, a.remaining, a.reserved, err
			}
			// The State is closing (a reload replaced it): reserved as a
			// small budget is, while its connection lasts.
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	key := s.cfg.Prefix + "tokens:" + name
	r, err := reserveTokens.Run(ctx, s.rdb, []string{key}, limit, n).Int64Slice()
	s.result("tokens", err)
	if err == nil && len(r) != 5 {
		err = redis.Nil
	}
	if err != nil {
		return hold, false, 0, 0, 0, err
	}
	return TokenHold{Name: name, Minute: r[3], Reserved: n}, r[0] == 1, time.Duration(r[1]) * time.Microsecond, r[2], r[4], nil
}

// SettleTokens turns hold into used tokens spent now (0: a refund), in
// the background: no request waits for it (but for a lease's end, as its
// State closes: up to the timeout). A hold of this State's lease
// settles into the lease's books; one of a lease whose State is closing
// (a reload replaced the link) as tokenLease.detached says.
func (s *State) SettleTokens(h TokenHold, used int64) {
	if h.lease != nil {
		if h.lease.st == s && h.lease.settle(h.Reserved, used) {
			return
		}
		h = h.lease.detached(h)
	}
	s.background("tokens", func(ctx context.Context) error {
		err := s.settleTokens(ctx, h, used)
		if _, answered := errors.AsType[redis.Error](err); err != nil && !answered && ctx.Err() == nil {
			err = s.settleTokens(ctx, h, used) // once more: a lost settlement holds its reservation for minutes
		}
		return err
	})
}

func (s *State) settleTokens(ctx context.Context, h TokenHold, used int64) error {
	return settleTokens.Run(ctx, s.rdb, []string{s.cfg.Prefix + "tokens:" + h.Name}, h.Minute, h.Reserved, max(used, 0)).Err()
}

// heartbeat keeps this replica in the fleet's membership (a sorted set
// of replica ids by their last beat; those silent for replicaTTL are
// dropped) and returns how many replicas are in it.
var heartbeat = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
return redis.call('ZCARD', KEYS[1])`)

// The membership: a replica beats every replicaBeat, and counts as live
// for replicaTTL after its last beat.
const (
	replicaBeat = 3 * time.Second
	replicaTTL  = 10 * time.Second
)

// beat runs the heartbeat until ctx ends, keeping Replicas current.
func (s *State) beat(ctx context.Context) {
	defer s.done.Done()
	defer s.recovered("heartbeat")
	t := time.NewTicker(replicaBeat)
	defer t.Stop()
	for {
		c, cancel := context.WithTimeout(ctx, max(s.cfg.Timeout, time.Second))
		n, err := heartbeat.Run(c, s.rdb, []string{s.cfg.Prefix + "replicas"}, s.id, replicaTTL.Milliseconds()).Int64()
		cancel()
		if err == nil && n > 0 {
			s.replicas.Store(n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Replicas is how many replicas the fleet's membership last counted
// (this one included; at least 1): what a budget is divided by while
// Redis is down.
func (s *State) Replicas() int64 { return max(s.replicas.Load(), 1) }

// Spent is what the fleet's client name has spent in period (USD). err
// means Redis did not answer within the timeout: the caller decides
// (on_failure).
func (s *State) Spent(name string, period int64) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	v, err := s.rdb.Get(ctx, s.spendKey(name, period)).Float64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	s.result("spend", err)
	return v, err
}

// AddSpend adds usd to what name spent in period, which ends at end (the
// key is dropped a day after), in the background.
func (s *State) AddSpend(name string, period int64, usd float64, end time.Time) {
	key := s.spendKey(name, period)
	s.background("spend", func(ctx context.Context) error {
		_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.IncrByFloat(ctx, key, usd)
			p.ExpireAt(ctx, key, end.Add(24*time.Hour))
			return nil
		})
		return err
	})
}

func (s *State) spendKey(name string, period int64) string {
	return s.cfg.Prefix + "spend:" + name + ":" + strconv.FormatInt(period, 10)
}
