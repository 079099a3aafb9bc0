package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sturdy/internal/chaos"
)

// The chaos scenario is the chaos property test's generator
// (internal/chaos), run longer and through each target in turn with the
// same seed: a pool of two primaries (faults of every kind, streams cut
// past their first word, kill windows) and a steady fallback. Half the
// requests stream. It reports the client-visible failures — a non-200,
// a stream not ended by [DONE], a text other than the canonical answer —
// and the amplification (upstream requests per client request).
//
// The servers listen on -fake-listen's port + 11, + 12, + 13 (18011–18013
// by default), where the peers' chaos listeners point.

const (
	// chaosWorkers is how many requests are in flight at once.
	chaosWorkers = 8
	// chaosSettle is how long the servers and the target run before the
	// load: a peer's health checks see the servers up (HAProxy's rise 2
	// every 500 ms).
	chaosSettle = 1500 * time.Millisecond
	// chaosGap is the time between a stream's words.
	chaosGap = 5 * time.Millisecond
)

// chaosRun is one target's outcome.
type chaosRun struct {
	target   string
	requests int
	failures map[string]int // by kind: a status, "cut stream", "error event", "wrong text", "bad body", "transport"
	upstream int64
	lat      []time.Duration
	elapsed  time.Duration
}

// failed is the count of client-visible failures.
func (r chaosRun) failed() int {
	n := 0
	for _, v := range r.failures {
		n += v
	}
	return n
}

// chaosTarget is one thing the chaos run goes through: url for the
// servers' addresses (p1, p2, fb), and a stop.
type chaosTarget struct {
	name  string
	start func(addrs []string) (url string, stop func(), err error)
	// settle: wait chaosSettle before the load (a peer's health checks).
	settle bool
}

// chaosSturdy is Sturdy's config for the run: the pool of two primaries
// and the fallback, first_byte 1s (a stall is given up on), stream_hold
// (a cut stream is retried unseen), and max_total_attempts leaving the
// fallback the two attempts it may need.
const chaosSturdy = `  - name: fb
    url: http://%s
    timeouts: {connect: 1s, first_byte: 1s, idle: 2s}
routes:
  - name: default
    upstream: fake
    fallbacks: [{upstream: fb}]
    stream_hold: {max: 5s, bytes: 64KiB}
    retry: {max_attempts: 4, max_total_attempts: 6, base_delay: 20ms, max_delay: 100ms}
`

// chaosTargets lists direct (the first primary alone: no retries, no
// fallback), Sturdy, and each peer with a chaos listener (-peer
// name/chaos=URL).
func chaosTargets(bin string, c *command) []chaosTarget {
	var ts []chaosTarget
	if !c.noDirect {
		ts = append(ts, chaosTarget{name: "direct", start: func(addrs []string) (string, func(), error) {
			return "http://" + addrs[0], func() {}, nil
		}})
	}
	ts = append(ts, chaosTarget{name: "sturdy", start: func(addrs []string) (string, func(), error) {
		addr, err := freeAddr()
		if err != nil {
			return "", nil, err
		}
		sc := &scenario{name: "chaos", sturdy: fmt.Sprintf(chaosSturdy, addrs[2]), timeouts: "{connect: 1s, first_byte: 1s, idle: 2s}"}
		var pid int
		stop, _, err := startSturdy(bin, addr, sc, []string{"http://" + addrs[0], "http://" + addrs[1]}, &pid)
		return "http://" + addr, stop, err
	}})
	for _, p := range c.peers {
		if u := p.scenarioURL["chaos"]; u != "" {
			ts = append(ts, chaosTarget{name: p.name, settle: true, start: func([]string) (string, func(), error) { return u, func() {}, nil }})
		}
	}
	return ts
}

// measureChaos runs 10 × tries requests through each target, against
// fresh servers of the same seed.
func measureChaos(bin string, c *command) ([]chaosRun, error) {
	var addrs []string
	for i := 10; i < 13; i++ {
		a, err := replicaAddr(c.fakeListen, i)
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, a)
	}
	var runs []chaosRun
	for _, t := range chaosTargets(bin, c) {
		r, err := chaosThrough(t, addrs, c.seed, 10*c.tries)
		if err != nil {
			return runs, fmt.Errorf("%s: %w", t.name, err)
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// chaosThrough starts the servers on addrs and runs n requests through t.
func chaosThrough(t chaosTarget, addrs []string, seed int64, n int) (chaosRun, error) {
	run := chaosRun{target: t.name, requests: n, failures: map[string]int{}}
	p1, err := chaos.Start("p1", addrs[0], chaos.Primary(seed, "p1", true), chaosGap)
	if err != nil {
		return run, err
	}
	defer p1.Kill()
	p2, err := chaos.Start("p2", addrs[1], chaos.Primary(seed, "p2", true), chaosGap)
	if err != nil {
		return run, err
	}
	defer p2.Kill()
	fb, err := chaos.Start("fb", addrs[2], chaos.Steady(seed, "fb"), chaosGap)
	if err != nil {
		return run, err
	}
	defer fb.Kill()
	url, stop, err := t.start([]string{p1.Addr, p2.Addr, fb.Addr})
	if err != nil {
		return run, err
	}
	defer stop()
	if t.settle {
		time.Sleep(chaosSettle)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: chaosWorkers}}
	defer client.CloseIdleConnections()

	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < chaosWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				chaosAsk(&run, &mu, client, url, seed, i, p1, p2)
			}
		}()
	}
	wg.Wait()
	run.elapsed = time.Since(start)
	run.upstream = p1.Requests() + p2.Requests() + fb.Requests()
	return run, nil
}

// chaosAsk sends request i through url, after taking the primaries down
// or up as the seed says for it, and notes its latency and failure in run
// (under mu).
func chaosAsk(run *chaosRun, mu *sync.Mutex, client *http.Client, url string, seed int64, i int, primaries ...*chaos.Server) {
	mu.Lock()
	for _, s := range primaries {
		if err := s.SetDown(chaos.Down(seed, s.Name, i)); err != nil {
			run.failures["harness: "+err.Error()]++
		}
	}
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	began := time.Now()
	why := chaos.Ask(ctx, client, url+"/v1/chat/completions", i%2 == 1, i)
	took := time.Since(began)
	cancel()
	mu.Lock()
	run.lat = append(run.lat, took)
	if why != "" {
		run.failures[chaosKind(why)]++
	}
	mu.Unlock()
}

// chaosKind names a failure's kind from what chaos.Ask said of it.
func chaosKind(why string) string {
	switch {
	case len(why) >= 3 && why[0] >= '1' && why[0] <= '5' && (len(why) == 3 || why[3] == ' '):
		return why[:3]
	case strings.HasPrefix(why, "a stream that did not end"):
		return "cut stream"
	case strings.HasPrefix(why, "an error in the stream"):
		return "error event"
	case strings.HasPrefix(why, "the text"):
		return "wrong text"
	case strings.HasPrefix(why, "an unreadable body"):
		return "bad body"
	}
	return "transport"
}

// chaosCannot is what each target cannot do about the faults, as
// configured in bench/peers.
var chaosCannot = map[string]string{
	"direct": "nothing is retried: the agent's SDK would have to",
	"sturdy": "—",
	"nginx": "retries each server at most once (3 tries here); retries a 429 at once, its retry-after-ms unread; " +
		"a stream cut after its first byte reaches the client as it is; cannot rewrite a fallback's model",
	"haproxy": "cannot retry a 429 (not in retry-on); the fallback serves only once both primaries' checks fail; " +
		"a stream cut after its first byte reaches the client as it is; cannot rewrite a fallback's model",
}

// chaosReport prints the runs side by side.
func chaosReport(w io.Writer, c *command, runs []chaosRun) {
	fmt.Fprintf(w, "### chaos\nseed %d, %d requests per target (half streamed), %d at once: a pool of two primaries with "+
		"every fault (kills, resets, stalls, 429 storms with and without a wait, 5xx bursts, slow starts, streams cut "+
		"past their first word) and a fallback that answers within two attempts\n\n", c.seed, 10*c.tries, chaosWorkers)
	fmt.Fprintf(w, "| target | failures | failure rate | of which | upstream requests | amplification | p50 ms | p99 ms | cannot |\n"+
		"|---|---:|---:|---|---:|---:|---:|---:|---|\n")
	for _, r := range runs {
		sort.Slice(r.lat, func(i, j int) bool { return r.lat[i] < r.lat[j] })
		q := func(p float64) float64 {
			if len(r.lat) == 0 {
				return 0
			}
			return float64(r.lat[min(len(r.lat)-1, int(p*float64(len(r.lat))))]) / float64(time.Millisecond)
		}
		var kinds []string
		for k, v := range r.failures {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, v))
		}
		sort.Strings(kinds)
		cannot := chaosCannot[r.target]
		if cannot == "" {
			cannot = "?"
		}
		fmt.Fprintf(w, "| %s | %d | %.2f %% | %s | %d | %.2f× | %.1f | %.1f | %s |\n", r.target, r.failed(),
			100*float64(r.failed())/float64(max(r.requests, 1)), strings.Join(kinds, ", "), r.upstream,
			float64(r.upstream)/float64(max(r.requests, 1)), q(0.5), q(0.99), cannot)
	}
	fmt.Fprintln(w)
}
