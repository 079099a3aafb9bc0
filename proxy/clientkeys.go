package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"sturdy/upstream"
)

// clientKey is a client key's settings as the table holds them: its
// requests' class (when set) and its own rate limit (nil: the clients:
// entries').
type clientKey struct {
	name        string
	priority    upstream.Priority
	hasPriority bool
	limit       *clientLimiter
}

// clientKeys are the keys client_keys_file lists, by their SHA-256.
type clientKeys map[[sha256.Size]byte]*clientKey

// buildClientKeys compiles ks; a key with a limit of its own has the
// settings of base (the first clients: entry keyed by credential; zero:
// none) where it leaves one unset. The keys of one setting share a limiter (a
// bucket per key in it, never evicted: the keys are at most
// MaxClientKeys), and a limiter whose settings prev had too is kept, so
// a reload keeps the buckets. A key that does not parse was refused by
// validation; here it is an error.
//
// Its time is linear in the keys and the budgets prev holds; stop
// closing (Shutdown) ends it with errShutDown.
func buildClientKeys(ks []ClientKey, base ClientLimit, prev clientKeys, onEvict func(), stop <-chan struct{}) (clientKeys, error) {
	if len(ks) == 0 {
		return nil, nil
	}
	if len(ks) > MaxClientKeys {
		return nil, fmt.Errorf("client_keys_file lists %d keys, more than %d", len(ks), MaxClientKeys)
	}
	limiters := map[ClientLimit]*clientLimiter{}
	for _, k := range prev {
		if k.limit != nil {
			limiters[k.limit.opts] = k.limit
		}
	}
	out := make(clientKeys, len(ks))
	// moved are the keys whose limiter changed: by their old limiter, the
	// new one by the key's id (a budget's, keyBudget.id).
	moved := map[*clientLimiter]map[string]*clientLimiter{}
	for i, k := range ks {
		if i%4096 == 0 && stopped(stop) {
			return nil, errShutDown
		}
		sum, err := k.hash()
		if err != nil {
			return nil, fmt.Errorf("client_keys_file: keys[%d]: %v", i, err)
		}
		ck := &clientKey{name: k.Name}
		if k.Priority != nil {
			ck.priority, ck.hasPriority = *k.Priority, true
		}
		if k.RequestsPerSecond > 0 || k.TokenLimits.any() || k.Spend.USD > 0 {
			lo := ClientLimit{KeyHeader: DefaultKeyHeader, RequestsPerSecond: k.RequestsPerSecond, Burst: k.Burst,
				TokenLimits: k.TokenLimits.or(base.TokenLimits), Spend: k.Spend}
			if k.Spend.USD <= 0 {
				lo.Spend = base.Spend
			}
			if k.RequestsPerSecond <= 0 {
				lo.RequestsPerSecond, lo.Burst = base.RequestsPerSecond, base.Burst
			}
			lo = lo.withDefaults()
			if ck.limit = limiters[lo]; ck.limit == nil {
				ck.limit = newClientLimiter(lo, onEvict)
				limiters[lo] = ck.limit
			}
			if pk := prev[sum]; pk != nil && pk.limit != nil && pk.limit != ck.limit {
				if moved[pk.limit] == nil {
					moved[pk.limit] = map[string]*clientLimiter{}
				}
				moved[pk.limit][hex.EncodeToString(sum[:6])] = ck.limit
			}
		}
		out[sum] = ck
	}
	for from, to := range moved {
		if !moveBudgets(from, to, stop) {
			return nil, errShutDown
		}
	}
	return out, nil
}

// moveBudgets gives each budget of from whose key to names (by its id)
// to that key's new limiter: a changed limit keeps what the key spent
// and owes. Each budget is looked at once; from's lock is taken a chunk
// at a time, so requests under it wait a chunk at most. false: stop
// closed.
func moveBudgets(from *clientLimiter, to map[string]*clientLimiter, stop <-chan struct{}) bool {
	if from.budgets == nil {
		return true
	}
	from.mu.Lock()
	hs := from.budgets.Keys() // the oldest first: the order stays
	from.mu.Unlock()
	const chunk = 1024
	for start := 0; start < len(hs); start += chunk {
		if stopped(stop) {
			return false
		}
		from.mu.Lock()
		type move struct {
			h  uint64
			b  *keyBudget
			to *clientLimiter
		}
		var moves []move
		for _, h := range hs[start:min(start+chunk, len(hs))] {
			if b, ok := from.budgets.Peek(h); ok {
				if l := to[b.id]; l != nil && l.budgets != nil {
					moves = append(moves, move{h, b, l})
				}
			}
		}
		from.mu.Unlock()
		for _, m := range moves {
			m.to.adopt(m.h, m.b)
		}
	}
	return true
}

// stopped reports whether stop is closed (nil: never).
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// hash is the key's SHA-256: its sha256 decoded, or its key's.
func (k ClientKey) hash() (sum [sha256.Size]byte, err error) {
	if k.Key != "" {
		return sha256.Sum256([]byte(k.Key)), nil
	}
	if len(k.SHA256) != 2*sha256.Size {
		return sum, fmt.Errorf("sha256 is not 64 hex digits")
	}
	if _, err := hex.Decode(sum[:], []byte(k.SHA256)); err != nil {
		return sum, fmt.Errorf("sha256 is not 64 hex digits")
	}
	return sum, nil
}

// classOf is the class of a request of route class pr (as the route or,
// where it lets it, x-sturdy-priority said: fromHeader) sent with k:
// a batch key is batch, an interactive key lifts the route's class but
// not a header's batch.
func (k *clientKey) classOf(pr upstream.Priority, fromHeader bool) upstream.Priority {
	switch {
	case k == nil || !k.hasPriority:
		return pr
	case k.priority == upstream.PriorityBatch:
		return upstream.PriorityBatch
	case fromHeader:
		return pr
	}
	return k.priority
}

// limited reports whether some key has a limit of its own.
func (ks clientKeys) limited() bool {
	for _, k := range ks {
		if k.limit != nil {
			return true
		}
	}
	return false
}
