package main

import (
	"fmt"
	"io"
	"time"

	"sturdy/internal/fakellm"
)

// runInterleaved measures every target of sc in turns instead of one
// after the other: each run is cut into slices, and every slice runs each
// target for its share of the run's length, all targets up meanwhile
// against the same fake servers. What a shared machine does to one
// moment (another tenant's burst, the hypervisor's steal) then falls on
// every target alike, and the ratios between them stay steady. Each
// target's figures add up its slices: requests, time, CPU; its peak RSS
// is the highest seen. Only for scenarios whose faults do not depend on
// time (sc.interleave).
func runInterleaved(sc *scenario, s settings, targets []target, fakeListen string, slices int, stderr io.Writer) ([]targetResult, error) {
	results := make([]targetResult, len(targets))
	for i, t := range targets {
		results[i].Target = t.name
	}
	for _, spec := range sc.runs(s) {
		fk, err := startFakes(sc, s, fakeListen)
		if err != nil {
			return nil, err
		}
		urls, pids, stop, err := startAll(sc, targets, fk)
		if err != nil {
			fk.close()
			return nil, err
		}
		fk.reset()
		acc := make([]slice, len(targets))
		for k := range slices {
			for i, t := range targets {
				label := fmt.Sprintf("%s/%s via %s, slice %d/%d", sc.name, spec.name, t.name, k+1, slices)
				acc[i].add(measureSlice(s, spec, urls[i], pids[i], fk, slices, label, sc.redisAddr, stderr))
			}
		}
		stop()
		fk.close()
		for i := range targets {
			a := &acc[i]
			rr := summarize(spec, a.recs, a.elapsed, a.stats, a.cpu, a.rss, len(pids[i]) > 0)
			if sc.figures != nil {
				rr.Figures = sc.figures(s, spec, a.recs, a.stats)
			}
			if sc.redisAddr != "" && len(a.recs) > 0 && len(pids[i]) > 0 {
				rr.Figures = append(rr.Figures, figure{Name: "redis ops/request", Value: float64(a.redisOps) / float64(len(a.recs))})
			}
			results[i].Runs = append(results[i].Runs, rr)
		}
	}
	return results, nil
}

// startAll starts every target in front of fk and returns their URLs and
// processes (read as each one starts: a variant shares its target's
// process holder) and one stop for all.
func startAll(sc *scenario, targets []target, fk fakes) (urls []string, pids [][]int, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range stops {
			f()
		}
	}
	for _, t := range targets {
		url, stopT, err := t.startFor(sc, fk)
		if err != nil {
			stop()
			return nil, nil, nil, fmt.Errorf("%s: %w", t.name, err)
		}
		stops = append(stops, stopT)
		var p []int
		if t.pids != nil {
			p = t.pids()
		}
		urls, pids = append(urls, url), append(pids, p)
	}
	return urls, pids, stop, nil
}

// slice is one target's share of one slice of a run, or the sum of its
// shares (add).
type slice struct {
	recs    []record
	elapsed time.Duration
	cpu     time.Duration
	rss     int64
	stats   fakellm.Stats
	// redisOps are the commands the scenario's Redis ran meanwhile.
	redisOps int64
}

// measureSlice runs spec's load against url for 1/slices of its length
// and reads what it cost: the processes' CPU, their RSS, the fake
// servers' counters it moved and the commands Redis (at redis, if any)
// ran.
func measureSlice(s settings, spec runSpec, url string, pids []int, fk fakes, slices int, label, redis string, stderr io.Writer) slice {
	st0, _ := fk.stats()
	cpu0 := procCPU(pids)
	ops0 := redisOps(redis)
	var sl slice
	sl.recs, sl.elapsed = runLoad(s, spec, url, slices, label, stderr)
	sl.cpu, sl.rss = procCPU(pids)-cpu0, procPeakRSS(pids)
	sl.redisOps = max(redisOps(redis)-ops0-1, 0)
	st1, _ := fk.stats()
	sl.stats = statsSince(st0, st1)
	return sl
}

// add adds sl to a: records, time and CPU summed, the higher RSS.
func (a *slice) add(sl slice) {
	a.recs = append(a.recs, sl.recs...)
	a.elapsed += sl.elapsed
	a.cpu += sl.cpu
	a.rss = max(a.rss, sl.rss)
	a.redisOps += sl.redisOps
	addStats(&a.stats, sl.stats)
}

// statsSince is what the fake servers counted between before and after.
func statsSince(before, after fakellm.Stats) fakellm.Stats {
	d := fakellm.Stats{Requests: after.Requests - before.Requests, EarlyRetries: after.EarlyRetries - before.EarlyRetries,
		InOutage: after.InOutage - before.InOutage, Fates: map[string]int64{}}
	for k, v := range after.Fates {
		if n := v - before.Fates[k]; n != 0 {
			d.Fates[k] = n
		}
	}
	return d
}
