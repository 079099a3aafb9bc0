package policy

import (
	"math/rand/v2"
	"testing"
)

func TestPickLeastRequests(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	rnd := r.Int64N
	if got := PickLeastRequests(nil, rnd); got != -1 {
		t.Fatalf("no candidates: %d", got)
	}
	if got := PickLeastRequests([]Candidate{{Weight: 0}, {Weight: 1, Load: 9}}, rnd); got != 1 {
		t.Fatalf("the only usable one: %d", got)
	}
	// A loaded endpoint loses every duel: with three endpoints it is drawn
	// in 2 of 3 pairs, and never picked.
	counts := make([]int, 3)
	for i := 0; i < 3000; i++ {
		counts[PickLeastRequests([]Candidate{{Weight: 1, Load: 10}, {Weight: 1}, {Weight: 1}}, rnd)]++
	}
	if counts[0] != 0 || counts[1] < 1200 || counts[2] < 1200 {
		t.Fatalf("picks %v", counts)
	}
	// Tried endpoints are avoided while another is usable, used when not.
	for i := 0; i < 100; i++ {
		if got := PickLeastRequests([]Candidate{{Weight: 1, Tried: true}, {Weight: 1, Load: 50}}, rnd); got != 1 {
			t.Fatalf("picked the endpoint this request failed on: %d", got)
		}
	}
	if got := PickLeastRequests([]Candidate{{Weight: 1, Tried: true}, {Weight: 0}}, rnd); got != 0 {
		t.Fatalf("the tried endpoint is the only one left: %d", got)
	}
	// Slow start: a weight of 0.25 takes about a quarter of the share.
	counts = make([]int, 2)
	loads := []int{0, 0}
	for i := 0; i < 4000; i++ {
		k := PickLeastRequests([]Candidate{{Weight: 0.25, Load: loads[0]}, {Weight: 1, Load: loads[1]}}, rnd)
		counts[k]++
		loads[k]++
		if i%8 == 7 { // requests finish
			loads = []int{loads[0] / 2, loads[1] / 2}
		}
	}
	if share := float64(counts[0]) / 4000; share > 0.35 || share < 0.1 {
		t.Fatalf("a ramping endpoint took %.2f of the requests", share)
	}
	// Under no load at all (every request done before the next), it
	// takes its weight's share: 0.25 ÷ 1.25.
	counts = make([]int, 2)
	for i := 0; i < 4000; i++ {
		counts[PickLeastRequests([]Candidate{{Weight: 0.25}, {Weight: 1}}, rnd)]++
	}
	if share := float64(counts[0]) / 4000; share < 0.15 || share > 0.25 {
		t.Fatalf("idle, a ramping endpoint took %.2f of the requests, want 0.2", share)
	}
}

func TestPickRoundRobin(t *testing.T) {
	cs := []Candidate{{Weight: 1}, {Weight: 0}, {Weight: 1, Tried: true}, {Weight: 1}}
	var got []int
	for turn := uint64(0); turn < 4; turn++ {
		got = append(got, PickRoundRobin(cs, turn, rand.Int64N))
	}
	if got[0] != 0 || got[1] != 3 || got[2] != 0 || got[3] != 3 {
		t.Fatalf("turns %v", got)
	}
	ramping := []Candidate{{Weight: 0.2}, {Weight: 1}}
	n := 0
	for turn := uint64(0); turn < 4000; turn++ {
		if PickRoundRobin(ramping, turn, rand.Int64N) == 0 {
			n++
		}
	}
	if share := float64(n) / 4000; share < 0.07 || share > 0.15 {
		t.Fatalf("a ramping endpoint at weight 0.2 took %.2f of the turns, want 0.1", share)
	}
}

func TestPickAffinityIsStickyAndBounded(t *testing.T) {
	var cs []Candidate
	for _, id := range []string{"a", "b", "c", "d"} {
		h := NewKeyHash()
		h.WriteString(id)
		cs = append(cs, Candidate{Weight: 1, ID: uint64(h)})
	}
	first := PickAffinity(cs, 42)
	for i := 0; i < 10; i++ {
		if PickAffinity(cs, 42) != first {
			t.Fatal("the same key moved with nothing changed")
		}
	}
	// Other keys are spread over the endpoints.
	seen := map[int]bool{}
	for k := uint64(0); k < 200; k++ {
		seen[PickAffinity(cs, k)] = true
	}
	if len(seen) != 4 {
		t.Fatalf("200 keys reached %d endpoints", len(seen))
	}
	// Its endpoint going out moves the key; another key's endpoint going
	// out does not.
	out := append([]Candidate(nil), cs...)
	out[first].Weight = 0
	if PickAffinity(out, 42) == first {
		t.Fatal("the key stayed on an endpoint that is out")
	}
	other := (first + 1) % 4
	var keyOnOther uint64
	for k := uint64(0); ; k++ {
		if PickAffinity(cs, k) == other {
			keyOnOther = k
			break
		}
	}
	if PickAffinity(out, keyOnOther) != other {
		t.Fatal("a key moved although its own endpoint stayed")
	}
	// Bounded load: an endpoint far above the mean passes the key on.
	loaded := append([]Candidate(nil), cs...)
	loaded[first].Load = 40
	if PickAffinity(loaded, 42) == first {
		t.Fatal("the key stayed on an endpoint above 1.25x the mean load")
	}
}
