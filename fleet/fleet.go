// Package fleet shares what one Sturdy learns with the others of its
// fleet through Redis: cooldowns (published, and loaded on every
// (re)connect), pacing and per-client limits (a GCRA state in Redis:
// blocks of it leased and spent locally when the limit is large enough,
// else one atomic reservation per request), token budgets (a
// reservation and a settlement per request, each atomic in Redis — or,
// when the budget is large enough, made in the books of a lease of it
// that one call now and then keeps in Redis), the replicas' membership
// and, opt-in, breaker hints. It is
// local-first: a request never waits on Redis longer than the timeout
// (twice, at worst, behind a lease's call in flight), and when Redis is slow or down the caller carries on with its own
// state (or refuses, as configured).
//
// The files: fleet.go the State (New, Close, reachability, cooldowns
// published and shortened, breaker hints), follow.go the events and the
// cooldowns loaded on (re)connect (a reply of a shape go-redis cannot
// read: a new subscription; a panic in a fleet goroutine: recovered),
// limit.go the GCRA reservation,
// lease.go the leases of it (taken, spent, renewed, lapsed) and the map
// both kinds of lease are kept in (leaseMap),
// tokens.go the token budgets' sliding minute and the membership
// (heartbeat, Replicas), tokenlease.go the token budgets' leases
// (reserved from, settled into, renewed, flushed, given back), resp.go the guard every Redis reply passes (its
// bounds).
package fleet

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Config is how to reach Redis and how to use it.
type Config struct {
	// URL is redis:// or rediss:// (go-redis's form, with the database).
	URL string
	// MasterName and SentinelAddrs, when set, find the master through
	// Sentinel instead (URL's password, database and TLS still apply).
	MasterName    string
	SentinelAddrs []string
	// Password, when set, overrides the URL's.
	Password string
	// Prefix starts every key and the events channel.
	Prefix string
	// HashKey, when set, keys credentials by HMAC-SHA-256 with it (else
	// SHA-256).
	HashKey string
	// Timeout bounds every Redis call a request waits for.
	Timeout time.Duration
	// ShareBreakers announces an endpoint's breaker opening to the fleet.
	ShareBreakers bool
	// MaxCooldowns bounds the cooldowns one (re)connect loads (the proxy
	// sets its per-key bound). Default DefaultMaxCooldowns.
	MaxCooldowns int
}

// DefaultMaxCooldowns is Config.MaxCooldowns's default when the caller
// sets none.
const DefaultMaxCooldowns = 100_000

// Key identifies a credential's (and model's) state in the fleet: a hash,
// never the credential.
type Key [16]byte

// Digest hashes parts (separated) into a Key: HMAC-SHA-256 with hashKey,
// or SHA-256 without one. It is the same in every process.
func Digest(hashKey string, parts ...[]byte) Key {
	if hashKey == "" {
		// The parts joined on the stack (a credential and a model fit):
		// no allocation on a request's path.
		var buf [512]byte
		b := buf[:0]
		for i, p := range parts {
			if i > 0 {
				b = append(b, 0)
			}
			b = append(b, p...)
		}
		sum := sha256.Sum256(b)
		return Key(sum[:len(Key{})])
	}
	// Written to the HMAC part by part: a joined stack buffer handed to
	// its Write (an interface call) would escape, and cost the unkeyed
	// path its allocation-free join.
	h := hmac.New(sha256.New, []byte(hashKey))
	for i, p := range parts {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write(p)
	}
	var k Key
	copy(k[:], h.Sum(nil))
	return k
}

// Cooldown is one cooldown as the fleet shares it.
type Cooldown struct {
	Upstream string
	Key      Key
	Until    time.Time
	// Streak counts 429s without a wait in a row (0 for a cooldown with
	// one): the next replica's doubling goes on from it.
	Streak int
}

// Hooks are how the fleet's news reaches the proxy.
type Hooks struct {
	// Cooldown is called for a cooldown another replica learned (and for
	// each one in force when the connection (re)opens, at most
	// Config.MaxCooldowns of them); it returns the end adopted. An end
	// earlier than the cooldown's (the proxy caps cooldowns) is written
	// back to Redis, so a cooldown too long is shortened for the fleet.
	Cooldown func(Cooldown) time.Time
	// BreakerOpened is called when another replica's breaker of an
	// endpoint opened, until when it expects to probe.
	BreakerOpened func(upstream, endpoint string, until time.Time)
	// Up is called when Redis becomes reachable (true) or not (false).
	Up func(bool)
	// Error counts a failed Redis call, by operation.
	Error func(op string)
	// Panicked counts a panic recovered in one of the fleet's goroutines.
	Panicked func()
}

// State is a connection to the fleet's Redis.
type State struct {
	cfg   Config
	rdb   redis.UniversalClient
	log   zerolog.Logger
	hooks Hooks
	up    atomic.Bool
	// probeAt is when, while down, the next call may try Redis again
	// (UnixNano): one per second finds out it is back; closed is set by
	// Close, after which no result counts.
	probeAt atomic.Int64
	closed  atomic.Bool
	stop    context.CancelFunc
	done    sync.WaitGroup
	// ps is the events subscription; closing it ends a Receive in
	// progress (which no context interrupts).
	ps atomic.Pointer[redis.PubSub]
	// refusedAt is when a dial was last refused (UnixNano): go-redis
	// retries a dial with pauses, so a call to a Redis that is not there
	// ends at its timeout, and only this tells it was refused.
	refusedAt atomic.Int64
	// id names this replica in the fleet's membership; replicas is how
	// many it last counted (beat).
	id       string
	replicas atomic.Int64
	// leases are the blocks of fleet-wide limits this replica spends
	// without a call (lease.go); tokenLeases its token budgets' leases
	// (tokenlease.go).
	leases      leaseMap[lease]
	tokenLeases leaseMap[tokenLease]
}

// dialFailed notes a dial's failure (see refusedAt).
func (s *State) dialFailed(err error) {
	if errors.Is(err, syscall.ECONNREFUSED) {
		s.refusedAt.Store(time.Now().UnixNano())
	}
}

// quiet drops go-redis's own log lines: they can name addresses, and the
// State logs each reachability change itself, once.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

var quietOnce sync.Once

// New makes the State without waiting on Redis: it connects in the
// background (an unreachable, slow or hostile Redis is not an error here,
// only a State that is down, and callers carry on as on_failure says),
// and starts following the fleet's events there. It speaks RESP2 (no
// HELLO), and every connection's replies pass a guard that refuses one
// announcing more than MaxReplyElements or MaxReplyBulk before go-redis
// reads it.
func New(cfg Config, log zerolog.Logger, hooks Hooks) (*State, error) {
	quietOnce.Do(func() { redis.SetLogger(quiet{}) })
	o, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, errors.New("shared_state.redis_url: not a redis:// or rediss:// URL go-redis accepts")
	}
	if cfg.Password != "" {
		o.Password = cfg.Password
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = max(cfg.Timeout, time.Second), cfg.Timeout, cfg.Timeout
	o.ContextTimeoutEnabled = true
	o.MaxRetries = 0 // a request waits one round trip at most
	o.Protocol, o.DisableIdentity = 2, true
	if cfg.MaxCooldowns <= 0 {
		cfg.MaxCooldowns = DefaultMaxCooldowns
	}
	s := &State{cfg: cfg, log: log, hooks: hooks, id: rand.Text()}
	o.Dialer = guard(redis.NewDialer(o), s.dialFailed) // NewDialer keeps the URL's TLS
	var rdb redis.UniversalClient
	if cfg.MasterName != "" {
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: cfg.MasterName, SentinelAddrs: cfg.SentinelAddrs,
			Password: o.Password, Username: o.Username, DB: o.DB, TLSConfig: o.TLSConfig, DialTimeout: o.DialTimeout,
			ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: true, MaxRetries: 0,
			Protocol: 2, DisableIdentity: true, Dialer: o.Dialer})
	} else {
		rdb = redis.NewClient(o)
	}
	ctx, stop := context.WithCancel(context.Background())
	s.rdb, s.stop = rdb, stop
	s.up.Store(true)               // until a call says otherwise
	s.ps.Store(rdb.Subscribe(ctx)) // no channel yet: nothing is sent, nothing waited for (follow subscribes)
	s.done.Add(2)
	go s.follow(ctx)
	go s.beat(ctx)
	return s, nil
}

// Close gives back the State's token leases (giveBackTokens), stops
// following the fleet and closes the connections; once.
func (s *State) Close() {
	if !s.closed.CompareAndSwap(false, true) {
		return
	}
	s.giveBackTokens()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	_ = s.rdb.ZRem(ctx, s.cfg.Prefix+"replicas", s.id).Err() // the others stop counting it now, not in replicaTTL
	cancel()
	s.stop()
	_ = s.ps.Load().Close()
	s.done.Wait()
	_ = s.rdb.Close()
}

// Up reports whether the last call to Redis succeeded.
func (s *State) Up() bool { return s.up.Load() }

// downProbe is how often, while Redis is down, one call tries it.
const downProbe = time.Second

// Usable reports whether a call should try Redis now: while it is up,
// always; while down, one call per downProbe (which finds out it is
// back), the others carry on without it at once.
func (s *State) Usable() bool {
	if s.up.Load() {
		return true
	}
	now := time.Now().UnixNano()
	at := s.probeAt.Load()
	return now >= at && s.probeAt.CompareAndSwap(at, now+int64(downProbe))
}

// Timeout is the longest a request waits on Redis.
func (s *State) Timeout() time.Duration { return s.cfg.Timeout }

// HashKey is the key credentials are hashed with ("" for SHA-256).
func (s *State) HashKey() string { return s.cfg.HashKey }

// result records a call's outcome: the first failure after success (and
// the first success after failure) is logged once, not per request.
func (s *State) result(op string, err error) {
	if s.closed.Load() {
		return // a call that outlived Close says nothing of the new State
	}
	if err == nil || errors.Is(err, redis.Nil) {
		if !s.up.Swap(true) {
			s.log.Info().Msg("shared state: Redis reachable again")
			if s.hooks.Up != nil {
				s.hooks.Up(true)
			}
		}
		return
	}
	if errors.Is(err, context.Canceled) {
		return
	}
	if s.hooks.Error != nil {
		s.hooks.Error(op)
	}
	if _, answered := errors.AsType[redis.Error](err); answered {
		return // Redis answered, with an error of its own: it is not down
	}
	s.probeAt.Store(time.Now().Add(downProbe).UnixNano())
	if s.up.Swap(false) {
		s.log.Warn().Str("op", op).Str("error", describe(err)).Msg("shared state: Redis unreachable, carrying on without it")
		if s.hooks.Up != nil {
			s.hooks.Up(false)
		}
	}
}

// Describe says what a failed call's Redis did, for an error message: it
// did not answer within the timeout, refused the connection (also when
// the call ended at its timeout while go-redis retried a refused dial),
// refused the credentials, or failed otherwise — never quoting a reply or
// an address.
func (s *State) Describe(err error) string {
	d := describe(err)
	if d == "timeout" && time.Since(time.Unix(0, s.refusedAt.Load())) <= 2*max(s.cfg.Timeout, time.Second) {
		d = "connection refused"
	}
	switch d {
	case "timeout":
		return "did not answer within " + s.cfg.Timeout.String()
	case "connection refused":
		return "refused the connection"
	case "authentication failed":
		return "refused the credentials"
	default:
		return "could not be reached (" + d + ")"
	}
}

// describe names a Redis failure without quoting a reply or an address.
func describe(err error) string {
	var ne interface{ Timeout() bool }
	switch {
	case errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "refused"):
		return "connection refused"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case strings.HasPrefix(err.Error(), "NOAUTH"), strings.HasPrefix(err.Error(), "WRONGPASS"):
		return "authentication failed"
	}
	return "connection failed"
}

func (s *State) channel() string { return s.cfg.Prefix + "events" }

func (s *State) cooldownKey(upstream string, k Key) string {
	return s.cfg.Prefix + "cooldown:" + upstream + ":" + hex.EncodeToString(k[:])
}

// setCooldown keeps the later of the stored cooldown and this one, and
// publishes it when it is the later: KEYS[1] the cooldown, KEYS[2] the
// channel; ARGV until (Unix ms), streak, the event.
var setCooldown = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
local untilMs = tonumber(ARGV[1])
if cur then
  local u = tonumber(string.match(cur, '^(%d+)'))
  if u and u >= untilMs then return 0 end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if untilMs <= now then return 0 end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], 'PX', untilMs - now + 1000)
redis.call('PUBLISH', KEYS[2], ARGV[3])
return 1`)

// PublishCooldown shares a cooldown this replica learned. It does not
// wait: the request that learned it goes on.
func (s *State) PublishCooldown(c Cooldown) {
	until := strconv.FormatInt(c.Until.UnixMilli(), 10)
	event := "c|" + c.Upstream + "|" + hex.EncodeToString(c.Key[:]) + "|" + until + "|" + strconv.Itoa(c.Streak)
	s.background("publish_cooldown", func(ctx context.Context) error {
		return setCooldown.Run(ctx, s.rdb, []string{s.cooldownKey(c.Upstream, c.Key), s.channel()}, until, c.Streak, event).Err()
	})
}

// shortenCooldown lowers a stored cooldown to ARGV[1] (Unix ms) when it
// ends later, keeping its streak: KEYS[1] the cooldown.
var shortenCooldown = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local u = tonumber(string.match(cur, '^(%d+)'))
local untilMs = tonumber(ARGV[1])
if not u or u <= untilMs then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if untilMs <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. (string.match(cur, ':(%d+)$') or '0'), 'PX', untilMs - now + 1000)
return 1`)

// shortenAll writes the earlier ends cs hold back to Redis (see
// Hooks.Cooldown), in one pipeline.
func (s *State) shortenAll(ctx context.Context, cs []Cooldown) error {
	if len(cs) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	for _, c := range cs {
		shortenCooldown.Eval(ctx, pipe, []string{s.cooldownKey(c.Upstream, c.Key)}, c.Until.UnixMilli())
	}
	_, err := pipe.Exec(ctx)
	return err
}

// AnnounceBreaker tells the fleet an endpoint's breaker opened, until
// when it expects to probe (with share_breakers).
func (s *State) AnnounceBreaker(upstream, endpoint string, until time.Time) {
	if !s.cfg.ShareBreakers {
		return
	}
	event := "b|" + upstream + "|" + endpoint + "|" + strconv.FormatInt(until.UnixMilli(), 10)
	s.background("publish_breaker", func(ctx context.Context) error {
		return s.rdb.Publish(ctx, s.channel(), event).Err()
	})
}

// background runs a call no request waits for, within the timeout.
func (s *State) background(op string, call func(context.Context) error) {
	go func() { // not waited for by Close: the timeout bounds it
		defer s.recovered(op)
		ctx, cancel := context.WithTimeout(context.Background(), max(s.cfg.Timeout, time.Second))
		defer cancel()
		s.result(op, call(ctx))
	}()
}
