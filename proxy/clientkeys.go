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
func buildClientKeys(ks []ClientKey, base ClientLimit, prev clientKeys, onEvict func()) (clientKeys, error) {
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
	for i, k := range ks {
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
				ck.limit.keepBudgets(pk.limit) // a changed budget keeps what the key spent
			}
		}
		out[sum] = ck
	}
	return out, nil
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
