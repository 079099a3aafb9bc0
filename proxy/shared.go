package proxy

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"sturdy/fleet"
	"sturdy/upstream"
)

// SharedState shares cooldowns, limits and breaker hints with the other
// replicas of a fleet through Redis (package fleet).
type SharedState struct {
	fleet.Config
	// Refuse answers 503 shared_state_unavailable when Redis does not
	// answer a shared limit in time (on_failure: refuse) instead of
	// carrying on with this replica's own state.
	Refuse bool
}

// The shared_state defaults.
const (
	DefaultSharedPrefix  = "sturdy:"
	DefaultSharedTimeout = 50 * time.Millisecond
)

func (s SharedState) withDefaults() SharedState {
	upstream.OrDefault(&s.Prefix, DefaultSharedPrefix)
	upstream.OrDefault(&s.Timeout, DefaultSharedTimeout)
	upstream.OrDefault(&s.MaxCooldowns, upstream.MaxTrackedKeys) // no more than the cooldown maps hold
	return s
}

// shared is the running connection to the fleet, with its settings.
type shared struct {
	opts SharedState
	st   *fleet.State
}

// startShared connects to the fleet when o asks for it and makes it the
// proxy's, closing the one it replaces; a reload that keeps the settings
// keeps the connection.
func (p *Proxy) startShared(o *SharedState) error {
	old := p.fleet.Load()
	if o != nil {
		d := o.withDefaults()
		o = &d
	}
	switch {
	case o == nil && old == nil:
		return nil
	case o != nil && old != nil && reflect.DeepEqual(*o, old.opts):
		return nil
	}
	var next *shared
	if o != nil {
		st, err := fleet.New(o.Config, p.log, fleet.Hooks{
			Cooldown:      func(c fleet.Cooldown) time.Time { return p.tbl.Load().adoptCooldown(c) },
			BreakerOpened: func(name, endpoint string, until time.Time) { p.tbl.Load().hint(name, endpoint, until) },
			Up:            func(up bool) { p.m.SharedStateUp.Set(boolGauge(up)) },
			Error:         func(op string) { p.m.SharedStateErrors.WithLabelValues(op).Inc() },
			Panicked:      func() { p.m.Panics.WithLabelValues("fleet").Inc() }})
		if err != nil {
			return err
		}
		next = &shared{opts: *o, st: st}
		p.m.SharedStateUp.Set(1)
	}
	p.fleet.Store(next)
	p.m.EnableSharedState(next != nil)
	if old != nil {
		old.st.Close()
	}
	switch {
	case next == nil:
		p.log.Info().Msg("shared state off: this replica learns and paces alone")
	default:
		p.log.Info().Str("key_prefix", next.opts.Prefix).Bool("refuse", next.opts.Refuse).
			Msg("shared state on: cooldowns and limits shared through Redis")
	}
	return nil
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// adoptCooldown adopts a cooldown another replica learned, capped at
// the upstream's cooldown.max, and returns the end adopted (the fleet
// shortens a longer one in Redis).
func (t *table) adoptCooldown(c fleet.Cooldown) time.Time {
	if up := t.upstream(c.Upstream); up != nil && up.BareCooldown() > 0 {
		return up.Cooldowns().Adopt(localKey(c.Key), time.Now(), c.Until, c.Streak)
	}
	return c.Until
}

// localKey is the cooldown map's key of a fleet key.
func localKey(k fleet.Key) uint64 { return binary.LittleEndian.Uint64(k[:8]) }

// hashKey is the key credentials are hashed with: the fleet's, or none
// (f nil: no fleet).
func (f *shared) hashKey() string {
	if f != nil {
		return f.st.HashKey()
	}
	return ""
}

// publishCooldown shares a cooldown this replica learned for key on up,
// if in a fleet (f nil: not).
func (f *shared) publishCooldown(up *upstream.Upstream, key fleet.Key, until time.Time, streak int) {
	if f != nil {
		f.st.PublishCooldown(fleet.Cooldown{Upstream: up.Name(), Key: key, Until: until, Streak: streak})
	}
}

// sharedLimit is how a fleet-wide limit answered: wait before the slot
// (taken), or that none comes within maxWait (not taken, wait is until
// one would); local says to use this replica's own limiter instead (no
// fleet, or Redis did not answer and on_failure is local); refused that
// Redis did not answer and on_failure is refuse.
type sharedLimit struct {
	wait           time.Duration
	taken          bool
	local, refused bool
	// why says, when refused, what Redis did: the message of the 503.
	why string
}

// reserve takes a slot of the fleet-wide limit name: from this
// replica's lease of it when it holds one (no call: fleet.TakeLeased),
// else from Redis. While Redis is known down only one request a second
// tries it (to find out it is back); the others never wait on a dead
// Redis. With no fleet (f nil) the limit is local.
func (f *shared) reserve(name string, rps float64, burst int, maxWait time.Duration) sharedLimit {
	if f == nil {
		return sharedLimit{local: true}
	}
	if f.st.TakeLeased(name, rps, burst) {
		return sharedLimit{taken: true}
	}
	var r sharedLimit
	why := f.call(func() (err error) { r.wait, r.taken, err = f.st.Reserve(name, rps, burst, maxWait); return err })
	return answer(f, r, why, sharedLimit{refused: true, why: why}, sharedLimit{local: true})
}

// call makes one call to the fleet's Redis, unless it is known down and
// this is not the second's one try; why says what Redis did when the call
// failed or was not made ("": it answered).
func (f *shared) call(do func() error) (why string) {
	if !f.st.Usable() {
		return "is down (a call failed within the last second; one call a second tries it again)"
	}
	if err := do(); err != nil {
		return f.st.Describe(err)
	}
	return ""
}

// answer is a shared limit's answer: answered when Redis answered (why
// ""), else refused with on_failure: refuse, else local.
func answer[T any](f *shared, answered T, why string, refused, local T) T {
	switch {
	case why == "":
		return answered
	case f.opts.Refuse:
		return refused
	}
	return local
}

// sharedTokens is how a fleet's token budget answered a reservation, as
// sharedLimit for a rate: taken (hold), or not (wait, what remains).
type sharedTokens struct {
	hold           fleet.TokenHold
	taken          bool
	wait           time.Duration
	remaining      int64
	reserved       int64
	local, refused bool
	why            string
}

// reserveTokens reserves n tokens of the fleet's budget name (limit a
// minute), as reserve takes a rate's slot: while Redis is known down one
// request a second tries it.
func (f *shared) reserveTokens(name string, limit, n int64) sharedTokens {
	var r sharedTokens
	why := f.call(func() (err error) {
		r.hold, r.taken, r.wait, r.remaining, r.reserved, err = f.st.ReserveTokens(name, limit, n)
		return err
	})
	return answer(f, r, why, sharedTokens{refused: true, why: why}, sharedTokens{local: true})
}

// clientBudgetName names a client's token budget of kind k (tokenKinds:
// its spend budget) under a `clients:` entry in the fleet: by the entry's
// key header, the limit (two entries of one key header are two budgets;
// a changed limit starts afresh), the kind and the hash of the client's
// key, never the key.
func (f *shared) clientBudgetName(cl *clientLimiter, k tokenKind, key []byte) string {
	d := fleet.Digest(f.hashKey(), key)
	limit := strconv.FormatFloat(cl.opts.Spend.USD, 'g', -1, 64)
	if k < tokenKinds {
		limit = strconv.FormatInt(cl.opts.limit(k), 10)
	}
	return fmt.Sprintf("client:%s:%s:%d:%s", cl.opts.KeyHeader, limit, k, hex.EncodeToString(d[:]))
}

// spent is what the fleet's client name spent in period n; why says
// what Redis did when it did not answer (as reserve: while it is known
// down, one call a second tries it).
func (f *shared) spent(name string, n int64) (usd float64, why string) {
	why = f.call(func() (err error) { usd, err = f.st.Spent(name, n); return err })
	return usd, why
}

// upstreamBudgetName names an upstream's tokens_per_minute window of one
// model glob in the fleet.
func (f *shared) upstreamBudgetName(up *upstream.Upstream, glob string) string {
	return "upstream:" + up.Name() + ":" + glob
}

// sharedFailure is the error for a request refused because Redis did not
// answer (on_failure: refuse); why says what it did instead.
func sharedFailure(why string) *apiError {
	e := newError(CodeSharedState, why)
	e.retryAfter = time.Second
	return e
}

// clientLimitName names a `clients:` entry's limit of one client in the
// fleet: by its settings and the hash of its key, never the key — one
// allocation (the settings' part is the limiter's, built once).
func (f *shared) clientLimitName(cl *clientLimiter, key []byte) string {
	d := fleet.Digest(f.hashKey(), key)
	var b [128]byte
	return string(hex.AppendEncode(append(b[:0], cl.fleetName...), d[:]))
}

// breakerHint takes an endpoint another replica's breaker opened on out
// of this replica's picks until that replica's probe (share_breakers);
// this replica's own breaker is untouched and probes on its own.
func (t *table) hint(name, endpoint string, until time.Time) {
	if up := t.upstream(name); up != nil {
		up.Hint(endpoint, until)
	}
}

// breakerAnnouncer is what tells the fleet that an endpoint's breaker
// opened (share_breakers), nil when breakers are not shared (or f is nil:
// no fleet).
func (f *shared) breakerAnnouncer() func(upstream, endpoint string, until time.Time) {
	if f != nil && f.opts.ShareBreakers {
		return f.st.AnnounceBreaker
	}
	return nil
}
