package policy

import "math"

// Candidate is one endpoint as the picker sees it.
type Candidate struct {
	// Load is the requests in flight on it (streams included).
	Load int
	// Weight scales its share: 1 normally, less while it ramps up after
	// coming back (slow start); 0 or less means it cannot take requests.
	Weight float64
	// Tried is set when this request already failed on it (or it is at
	// its connection limit): it is picked only when no other can be.
	Tried bool
	// ID is a stable hash of its address (KeyHash), for affinity.
	ID uint64
}

// eligible lists the candidates a pick chooses among: those that can
// take a request, the ones this request failed on left out while another
// remains. It appends to buf.
func eligible(cs []Candidate, buf []int) []int {
	for pass := 0; pass < 2 && len(buf) == 0; pass++ {
		for i, c := range cs {
			if c.Weight > 0 && (pass == 1 || !c.Tried) {
				buf = append(buf, i)
			}
		}
	}
	return buf
}

// PickLeastRequests chooses by the power of two choices: two eligible
// candidates drawn at random (rnd(n) in [0, n)); of equal weight, the one
// with fewer requests in flight wins, a tie at random. Of unequal weights
// (one ramping up after coming back), each wins in proportion to its
// weight ÷ (requests in flight + 1), so a ramping endpoint gets its share
// under light load too, where loads tie. It returns -1 when none can
// take the request.
func PickLeastRequests(cs []Candidate, rnd func(int64) int64) int {
	var buf [64]int
	el := eligible(cs, buf[:0])
	switch len(el) {
	case 0:
		return -1
	case 1:
		return el[0]
	}
	i := int(rnd(int64(len(el))))
	j := int(rnd(int64(len(el) - 1)))
	if j >= i {
		j++
	}
	a, b := cs[el[i]], cs[el[j]]
	if a.Weight != b.Weight {
		ea, eb := a.Weight/float64(a.Load+1), b.Weight/float64(b.Load+1)
		if float64(rnd(1<<24))/(1<<24)*(ea+eb) < ea {
			return el[i]
		}
		return el[j]
	}
	if a.Load < b.Load || a.Load == b.Load && rnd(2) == 0 {
		return el[i]
	}
	return el[j]
}

// PickRoundRobin chooses the turn'th eligible candidate (turn counts up
// per pick); -1 when none can take the request. A candidate ramping up
// (Weight below 1) takes its turn with probability Weight, else passes
// it to the next.
func PickRoundRobin(cs []Candidate, turn uint64, rnd func(int64) int64) int {
	var buf [64]int
	el := eligible(cs, buf[:0])
	if len(el) == 0 {
		return -1
	}
	start := int(turn % uint64(len(el)))
	for k := range el {
		i := el[(start+k)%len(el)]
		if w := cs[i].Weight; w >= 1 || float64(rnd(1<<24))/(1<<24) < w {
			return i
		}
	}
	return el[start]
}

// AffinityBound is how far above the mean load a sticky endpoint may go
// before a key moves on (consistent hashing with bounded loads).
const AffinityBound = 1.25

// PickAffinity sends a key to the same endpoint while it is eligible and
// under the load bound: the eligible candidates are ranked for the key by
// rendezvous hashing (each endpoint id hashed with the key, highest
// first), and the first whose load stays within AffinityBound × the mean
// (rounded up) takes it. An endpoint going out moves only its own keys.
// The ranking depends only on the IDs and the key, so every Sturdy (and
// every restart) sends a key to the same endpoint.
func PickAffinity(cs []Candidate, key uint64) int {
	var buf [64]int
	el := eligible(cs, buf[:0])
	if len(el) == 0 {
		return -1
	}
	total := 1 // the request being placed
	for _, i := range el {
		total += cs[i].Load
	}
	bound := int(math.Ceil(AffinityBound * float64(total) / float64(len(el))))
	best, bestScore := -1, uint64(0)
	for range el { // the highest-scoring endpoint under the bound
		best, bestScore = -1, 0
		for _, i := range el {
			if s := score(cs[i].ID, key); (best < 0 || s > bestScore) && cs[i].Load < bound {
				best, bestScore = i, s
			}
		}
		if best >= 0 {
			return best
		}
		bound++ // every endpoint is at the bound: relax it
	}
	return el[0]
}

// score is endpoint id's rank for key: splitmix64 of the two.
func score(id, key uint64) uint64 {
	z := id ^ key + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// KeyHash is a 64-bit FNV-1a hash, written to in pieces: affinity keys
// and endpoint IDs. Its zero value is not ready: start from NewKeyHash.
type KeyHash uint64

// NewKeyHash returns an empty hash.
func NewKeyHash() KeyHash { return 14695981039346656037 }

// Write adds b to the hash.
func (h *KeyHash) Write(b []byte) {
	for _, c := range b {
		*h = (*h ^ KeyHash(c)) * 1099511628211
	}
}

// WriteString adds s to the hash.
func (h *KeyHash) WriteString(s string) {
	for i := 0; i < len(s); i++ {
		*h = (*h ^ KeyHash(s[i])) * 1099511628211
	}
}
