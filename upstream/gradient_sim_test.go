package upstream

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// gpu is a streaming model server as the bench's fake one (bench/gpu.go):
// slots parallel places and a FIFO queue inside that never refuses; a
// reply's first content comes first after it gets a slot, then tokens
// (outMin–outMax, uniformly) of perToken · (1 + active ÷ slots) each. A
// reply holds its slot, and Sturdy's place, to its end: a sample comes a
// time to first content after dispatch, a place is freed a whole reply
// later.
type gpu struct {
	slots          int
	first          time.Duration
	perToken       time.Duration
	outMin, outMax int
	noise          float64
}

// gpuPhase is the server for a while (from at).
type gpuPhase struct {
	at  time.Duration
	gpu gpu
}

// simEvent is a reply's next step at a time of the fake clock.
type simEvent struct {
	at   time.Duration
	kind int // simFirst: first content; simEnd: the reply ends
	sent time.Duration
	// tokens is the reply's length, drawn as it starts.
	tokens int
}

const (
	simFirst = iota
	simEnd
)

type simEvents []simEvent

func (e simEvents) Len() int           { return len(e) }
func (e simEvents) Less(i, j int) bool { return e[i].at < e[j].at }
func (e simEvents) Swap(i, j int)      { e[i], e[j] = e[j], e[i] }
func (e *simEvents) Push(x any)        { *e = append(*e, x.(simEvent)) }
func (e *simEvents) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// simLoop runs clients closed-loop (each sends its next request as its
// last ends) through g's limit onto the server of phases, on a fake
// clock, for d; it returns the limit in force every 100 ms and the replies ended.
func simLoop(g *gradient, clients int, phases []gpuPhase, d time.Duration) (limits []float64, done int) {
	r := rand.New(rand.NewPCG(3, 4))
	var ev simEvents
	var now time.Duration
	inFlight, waiting, active := 0, clients, 0
	var serverQueue []time.Duration // the sent times of those waiting inside the server
	srv := phases[0].gpu
	start := func(sent time.Duration) { // a slot is free: the reply begins
		active++
		first := time.Duration(float64(srv.first) * (1 + srv.noise*(2*r.Float64()-1)))
		heap.Push(&ev, simEvent{at: now + first, kind: simFirst, sent: sent,
			tokens: srv.outMin + r.IntN(srv.outMax-srv.outMin+1)})
	}
	admit := func() { // Sturdy's queue: the waiting go while there is room
		for waiting > 0 && inFlight < max(1, int(g.limit)) {
			waiting--
			inFlight++
			if active < srv.slots {
				start(now)
			} else {
				serverQueue = append(serverQueue, now)
			}
		}
	}
	next, phase := 100*time.Millisecond, 1
	admit()
	for len(ev) > 0 && now < d {
		e := heap.Pop(&ev).(simEvent)
		for ; next <= e.at; next += 100 * time.Millisecond {
			limits = append(limits, float64(max(1, int(g.limit)))) // the limit in force
		}
		now = e.at
		if phase < len(phases) && now >= phases[phase].at {
			srv, phase = phases[phase].gpu, phase+1
		}
		switch e.kind {
		case simFirst:
			g.sample(now-e.sent, 1000, inFlight)
			perToken := float64(srv.perToken) * (1 + float64(active)/float64(srv.slots))
			heap.Push(&ev, simEvent{at: now + time.Duration(float64(e.tokens)*perToken), kind: simEnd})
		case simEnd:
			done++
			active--
			inFlight--
			waiting++ // its client sends again
			for active < srv.slots && len(serverQueue) > 0 {
				start(serverQueue[0])
				serverQueue = serverQueue[1:]
			}
			admit()
		}
	}
	return limits, done
}

// TestTheGradientSettlesOnAStreamingServer runs the control law against
// a streaming server on a fake clock — the bench's overload scenarios in
// seconds: where the limit settles, how soon, and that it does not swing
// (a sample comes a time to first content after dispatch, but a place is
// freed only a whole reply later: a law that grows per sample overshot
// to twice the slots and fell to 1, again and again).
func TestTheGradientSettlesOnAStreamingServer(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	eight := gpu{slots: 8, first: 33 * ms, perToken: ms, outMin: 16, outMax: 256}
	four, long := eight, eight
	four.slots = 4
	long.outMin = 256
	for _, tt := range []struct {
		name   string
		phases []gpuPhase
		// lo–hi is where the limit stays from settle on (after the last
		// phase began).
		settle time.Duration
		lo, hi float64
		// moves, when set, is the most the mean limit may move from
		// the first phase's last 10 s to the last's from settle on.
		moves float64
	}{
		// [0.75, 1.25] times the slots, within 10 s (the bench's targets).
		{"64 clients on 8 slots", []gpuPhase{{0, eight}}, 10 * time.Second, 6, 10, 0},
		{"8 slots, ±25 % noise", []gpuPhase{{0, with(eight, 0.25)}}, 10 * time.Second, 6, 10, 0},
		{"8 slots, then 4", []gpuPhase{{0, eight}, {30 * time.Second, four}}, 10 * time.Second, 3, 5, 0},
		{"4 slots, then 8", []gpuPhase{{0, four}, {30 * time.Second, eight}}, 10 * time.Second, 6, 10, 0},
		// Longer replies are not load: the first content comes as soon.
		{"outputs of 256 tokens only", []gpuPhase{{0, eight}, {30 * time.Second, long}}, 10 * time.Second, 6, 10, 0.2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := newGradient(testConcurrency(ConcurrencyAdaptive, 64))
			limits, done := simLoop(&g, 64, tt.phases, 60*time.Second)
			from := int((tt.phases[len(tt.phases)-1].at + tt.settle) / (100 * ms))
			lo, hi := limits[from], limits[from]
			for _, l := range limits[from:] {
				lo, hi = min(lo, l), max(hi, l)
			}
			t.Logf("%d replies; limit from %.0f s in [%.1f, %.1f]; by second: %s", done, float64(from)/10, lo, hi, bySecond(limits))
			if lo < tt.lo || hi > tt.hi {
				t.Fatalf("the limit went over [%.1f, %.1f], want it in [%g, %g]", lo, hi, tt.lo, tt.hi)
			}
			if tt.moves > 0 {
				before, after := mean(limits[200:300]), mean(limits[from:])
				if math.Abs(after-before) > tt.moves*before {
					t.Fatalf("the mean limit moved from %.2f to %.2f, more than %.0f %%", before, after, 100*tt.moves)
				}
			}
		})
	}
}

func mean(vs []float64) float64 {
	var sum float64
	for _, v := range vs {
		sum += v
	}
	return sum / float64(len(vs))
}

func with(g gpu, noise float64) gpu {
	g.noise = noise
	return g
}

// bySecond is the limit at each second, for a failure's log.
func bySecond(limits []float64) string {
	var s string
	for i := 9; i < len(limits); i += 10 {
		s += fmt.Sprintf(" %.0f", limits[i])
	}
	return s
}
