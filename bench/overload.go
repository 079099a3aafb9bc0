package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The overload scenarios (solo): a fake GPU server that queues instead of
// failing, measured directly, through Sturdy with an adaptive limit,
// through Sturdy with the best fixed limit (the server's slots) and one
// over it, and through nginx with max_conns = the slots.

// olGroup is a group of clients: n of them closed-loop (rate 0: each
// sends its next request when its last ended, after a 503's
// retry-after-ms like an SDK) or one open-loop sender at rate per second,
// all of one tenant and class.
type olGroup struct {
	n      int
	rate   float64
	tenant string
	class  string
}

// olScenario is one overload scenario: the server, the clients, and
// what the server becomes at half time.
type olScenario struct {
	name, about string
	gpu         gpuShape
	groups      []olGroup
	// then, when set, is the server from half time on.
	then *gpuShape
	// solo, when set, also measures this group alone through the adaptive
	// Sturdy (a baseline for a figure).
	solo *olGroup
	// extra are targets measured in this scenario only.
	extra []olTarget
}

// olBody is the scenarios' request: a prompt of about 1 KiB (256 prompt
// tokens: 12.8 ms of prefill).
var olBody = []byte(`{"model":"fake-model","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("Tell me about the cluster. ", 38) + `"}]}`)

// olUnloaded is a reply's time to first content on an idle server.
var olUnloaded = millis(gpuBase + time.Duration(len(olBody)/4)*gpuPerPromptToken)

const olSlots = 8

// olGPU is the scenarios' server: 8 slots, outputs of 16–256 tokens.
var olGPU = gpuShape{slots: olSlots, outMin: 16, outMax: 256}

var olScenarios = []olScenario{
	{name: "overload", about: "64 closed-loop clients on 8 slots",
		gpu: olGPU, groups: []olGroup{{n: 64, tenant: "a", class: "interactive"}}},
	{name: "capacity-drop", about: "64 clients; the slots drop from 8 to 4 at half time",
		gpu: olGPU, groups: []olGroup{{n: 64, tenant: "a", class: "interactive"}},
		then: &gpuShape{slots: 4, outMin: 16, outMax: 256}},
	{name: "long-outputs", about: "64 clients; every output 256 tokens from half time",
		gpu: olGPU, groups: []olGroup{{n: 64, tenant: "a", class: "interactive"}},
		then: &gpuShape{slots: olSlots, outMin: 256, outMax: 256}},
	{name: "priorities", about: "8 interactive and 56 batch clients",
		gpu: olGPU, groups: []olGroup{{n: 8, tenant: "a", class: "interactive"}, {n: 56, tenant: "b", class: "batch"}},
		extra: []olTarget{{name: "sturdy adaptive, batch_share 25 %", concurrency: "{mode: adaptive, max: 64, batch_share: 25%, queue: {max: 256, timeout: 30s}}"}}},
	{name: "noisy-neighbour", about: "tenant A open-loop at 60/s (about 2× capacity), tenant B at 3/s",
		gpu: olGPU, groups: []olGroup{{rate: 60, tenant: "a", class: "interactive"}, {rate: 3, tenant: "b", class: "interactive"}},
		solo: &olGroup{rate: 3, tenant: "b", class: "interactive"}},
}

// olTarget is how the scenarios reach the server: directly, or through
// Sturdy with concurrency set so.
type olTarget struct {
	name        string
	concurrency string // "": direct (or nginx)
	nginx       bool   // nginx, max_conns = the slots (overload_nginx.go)
}

var olTargets = []olTarget{
	{name: "direct"},
	{name: "sturdy adaptive", concurrency: "{mode: adaptive, max: 64, queue: {max: 256, timeout: 30s}}"},
	{name: fmt.Sprintf("sturdy fixed %d", olSlots), concurrency: fmt.Sprintf("{mode: fixed, max: %d, queue: {max: 256, timeout: 30s}}", olSlots)},
	// One over the slots: where an adaptive limit probes (its +1).
	{name: fmt.Sprintf("sturdy fixed %d", olSlots+1), concurrency: fmt.Sprintf("{mode: fixed, max: %d, queue: {max: 256, timeout: 30s}}", olSlots+1)},
	{name: fmt.Sprintf("nginx max_conns=%d", olSlots), nginx: true},
}

// olRequest is one request as its client saw it.
type olRequest struct {
	at       time.Duration // sent, from the run's start
	ttft     float64       // ms to the first content (0: none)
	status   int           // 0: transport error
	complete bool
	group    int
}

// olRun is one scenario through one target.
type olRun struct {
	target   string
	d        time.Duration
	reqs     []olRequest
	limits   []timedValue // the adaptive limit, polled
	server   []float64    // the server's TTFTs of the second half, ms
	errors   int64        // the server's own (never, by design)
	overflow int64        // open-loop requests not sent: 1,000 already in flight
	solo     bool         // a group alone, a baseline: its limit is not a figure
}

// measureOverload runs the overload scenario named (or all of them).
func measureOverload(bin, name string, d time.Duration) ([]olScenario, [][]olRun, error) {
	var scs []olScenario
	var runs [][]olRun
	for _, sc := range olScenarios {
		if name != "overload-all" && sc.name != name {
			continue
		}
		var rs []olRun
		for _, t := range slices.Concat(olTargets, sc.extra) {
			if _, err := exec.LookPath("nginx"); t.nginx && err != nil {
				fmt.Fprintf(os.Stderr, "%s via %s: skipped, nginx is not installed (apt-get install nginx-light)\n", sc.name, t.name)
				continue
			}
			r, err := runOverload(bin, sc, sc.groups, t, d)
			if err != nil {
				return nil, nil, fmt.Errorf("%s via %s: %w", sc.name, t.name, err)
			}
			rs = append(rs, r)
		}
		if sc.solo != nil {
			r, err := runOverload(bin, sc, []olGroup{*sc.solo}, olTargets[1], d)
			if err != nil {
				return nil, nil, err
			}
			r.target, r.solo = "sturdy adaptive, "+sc.solo.tenant+" alone", true
			rs = append(rs, r)
		}
		scs, runs = append(scs, sc), append(runs, rs)
	}
	return scs, runs, nil
}

// runOverload runs groups against a fresh fake GPU server through t for d.
func runOverload(bin string, sc olScenario, groups []olGroup, t olTarget, d time.Duration) (olRun, error) {
	g, err := startGPU(sc.gpu)
	if err != nil {
		return olRun{}, err
	}
	defer g.close()
	url, admin := g.url(), ""
	if t.nginx {
		addr, stop, err := startNginx(url, sc.gpu.slots)
		if err != nil {
			return olRun{}, err
		}
		defer stop()
		url = "http://" + addr
	}
	if t.concurrency != "" {
		addr, err := freeAddr()
		if err != nil {
			return olRun{}, err
		}
		if admin, err = freeAddr(); err != nil {
			return olRun{}, err
		}
		cfg := &scenario{name: sc.name, timeouts: "{connect: 1s, first_byte: 60s, idle: 30s}", sturdy: "    concurrency: " + t.concurrency +
			"\nroutes:\n  - {name: all, path_prefix: /, upstream: fake, priority_header: true, deadline: 120s, retry: {max_attempts: 1}}\n"}
		var pid int
		stop, _, err := startSturdyAt(bin, addr, admin, cfg, []string{url}, &pid)
		if err != nil {
			return olRun{}, err
		}
		defer stop()
		url = "http://" + addr
	}
	run := olRun{target: t.name, d: d}
	start := time.Now()
	g.mu.Lock()
	g.start = start
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	if admin != "" {
		wg.Add(1)
		go func() { defer wg.Done(); run.limits = pollLimit(ctx, admin, start) }()
	}
	if sc.then != nil {
		time.AfterFunc(d/2, func() { g.set(*sc.then) })
	}
	var mu sync.Mutex
	add := func(r olRequest) {
		mu.Lock()
		run.reqs = append(run.reqs, r)
		mu.Unlock()
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}
	var inFlight atomic.Int64
	for gi, gr := range groups {
		if gr.rate > 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(time.Duration(float64(time.Second) / gr.rate))
				defer tick.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					if inFlight.Add(1) > 1000 {
						inFlight.Add(-1)
						atomic.AddInt64(&run.overflow, 1)
						continue
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer inFlight.Add(-1)
						r, _ := olSend(client, url, gr, start)
						r.group = gi
						add(r)
					}()
				}
			}()
			continue
		}
		for range gr.n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					r, wait := olSend(client, url, gr, start)
					r.group = gi
					add(r)
					time.Sleep(min(wait, time.Second))
				}
			}()
		}
	}
	wg.Wait()
	run.server = g.serverTTFTs(d/2, d)
	run.errors = g.errors.Load()
	return run, nil
}

// olSend sends one request of group gr and reads its stream; wait is
// how long a 503 asked the client to wait (retry-after-ms).
func olSend(client *http.Client, url string, gr olGroup, start time.Time) (r olRequest, wait time.Duration) {
	sent := time.Now()
	r.at = sent.Sub(start)
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", bytes.NewReader(olBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer tenant-"+gr.tenant)
	req.Header.Set("X-Sturdy-Priority", gr.class)
	resp, err := client.Do(req)
	if err != nil {
		return r, 100 * time.Millisecond
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	if resp.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, resp.Body)
		n, err := strconv.Atoi(resp.Header.Get("Retry-After-Ms"))
		if err != nil {
			return r, 500 * time.Millisecond // no wait told: an SDK's first retry's
		}
		return r, time.Duration(n) * time.Millisecond
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if r.ttft == 0 && strings.Contains(line, `"content"`) {
			r.ttft = millis(time.Since(sent))
		}
		if line == "data: [DONE]" {
			r.complete = true
		}
	}
	return r, 0
}

// pollLimit reads the endpoint's limit from /debug/upstreams every
// 200 ms until ctx ends.
func pollLimit(ctx context.Context, admin string, start time.Time) []timedValue {
	var out []timedValue
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		resp, err := http.Get("http://" + admin + "/debug/upstreams")
		if err != nil {
			continue
		}
		var doc struct {
			Upstreams []struct {
				Endpoints []struct {
					Concurrency *struct{ Limit int } `json:"concurrency"`
				} `json:"endpoints"`
			} `json:"upstreams"`
		}
		err = json.NewDecoder(resp.Body).Decode(&doc)
		resp.Body.Close()
		if st := doc.Upstreams; err == nil && len(st) > 0 && len(st[0].Endpoints) > 0 && st[0].Endpoints[0].Concurrency != nil {
			out = append(out, timedValue{at: time.Since(start), v: float64(st[0].Endpoints[0].Concurrency.Limit)})
		}
	}
}

// olFigures are one run's numbers.
type olFigures struct {
	throughput                 float64 // completions per second, second half
	ttftP50, ttftP99           float64 // client-seen, second half, group 0
	serverP99                  float64 // the server's, second half: what an admitted request waits
	limitFirst, limitLast      float64 // mean limit over the first half's second half and the last quarter
	settled                    float64 // s: from when (or half time, with a change) the limit stays in its band; -1 never
	shed, failed               int     // 503s; other failures
	groupOK, groupP99, groupTP []float64
}

func (r olRun) figures(sc olScenario) olFigures {
	var f olFigures
	half := r.d / 2
	var ttfts []float64
	f.groupOK, f.groupP99, f.groupTP = make([]float64, 4), make([]float64, 4), make([]float64, 4)
	groupTTFTs := make([][]float64, 4)
	groupAll := make([]int, 4)
	for _, q := range r.reqs {
		switch {
		case q.status == 503:
			f.shed++
		case q.status != 200 || !q.complete:
			f.failed++
		}
		if q.at < half {
			continue
		}
		groupAll[q.group]++
		if q.complete {
			f.throughput++
			f.groupOK[q.group]++
			f.groupTP[q.group]++
			groupTTFTs[q.group] = append(groupTTFTs[q.group], q.ttft)
			if q.group == 0 {
				ttfts = append(ttfts, q.ttft)
			}
		}
	}
	secs := half.Seconds()
	f.throughput /= secs
	for i := range groupAll {
		f.groupTP[i] /= secs
		if groupAll[i] > 0 {
			f.groupOK[i] = 100 * f.groupOK[i] / float64(groupAll[i])
		}
		f.groupP99[i] = pctl(groupTTFTs[i], 99)
	}
	f.ttftP50, f.ttftP99 = pctl(ttfts, 50), pctl(ttfts, 99)
	f.serverP99 = pctl(r.server, 99)
	f.limitFirst, f.limitLast = meanOver(r.limits, r.d/4, half), meanOver(r.limits, r.d*3/4, r.d)
	slots, from := sc.gpu.slots, time.Duration(0)
	if sc.then != nil {
		slots, from = sc.then.slots, half
	}
	f.settled = settleTime(r.limits, from, 0.75*float64(slots), 1.25*float64(slots))
	return f
}

func meanOver(vs []timedValue, from, to time.Duration) float64 {
	var sum float64
	var n int
	for _, v := range vs {
		if v.at >= from && v.at < to {
			sum += v.v
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// settleTime is how long after from the limit entered [lo, hi] for good
// (seconds; -1: it never stayed).
func settleTime(vs []timedValue, from time.Duration, lo, hi float64) float64 {
	last := -1
	for i, v := range vs {
		if v.at >= from && (v.v < lo || v.v > hi) {
			last = i
		}
	}
	switch {
	case len(vs) == 0 || last == len(vs)-1:
		return -1
	case last < 0:
		for _, v := range vs {
			if v.at >= from {
				return (v.at - from).Seconds()
			}
		}
		return -1
	}
	return (vs[last+1].at - from).Seconds()
}

// overloadReport prints each scenario's table.
func overloadReport(w io.Writer, scs []olScenario, runs [][]olRun) {
	fmt.Fprintf(w, "Unloaded time to first content: %.1f ms. Figures over each run's second half.\n\n", olUnloaded)
	for i, sc := range scs {
		fmt.Fprintf(w, "### %s — %s\n\n", sc.name, sc.about)
		fmt.Fprintln(w, "| target | completions/s | client TTFT p50 / p99 ms | server TTFT p99 ms | limit (1st half → last ¼) | settled s | 503 | failed | per group: ok % · TTFT p99 ms · /s |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|")
		for _, r := range runs[i] {
			f := r.figures(sc)
			var groups []string
			for gi := range max(len(sc.groups), 1) {
				groups = append(groups, fmt.Sprintf("%.1f · %.0f · %.1f", f.groupOK[gi], f.groupP99[gi], f.groupTP[gi]))
			}
			limit, settled := "–", "–"
			if len(r.limits) > 0 && !r.solo {
				limit = fmt.Sprintf("%.1f → %.1f", f.limitFirst, f.limitLast)
				settled = fmt.Sprintf("%.1f", f.settled)
				if f.settled < 0 {
					settled = "never"
				}
			}
			fmt.Fprintf(w, "| %s | %.1f | %.0f / %.0f | %.0f | %s | %s | %d | %d | %s |\n", r.target, f.throughput, f.ttftP50, f.ttftP99,
				f.serverP99, limit, settled, f.shed, f.failed+int(r.errors)+int(r.overflow), strings.Join(groups, " ; "))
		}
		fmt.Fprintln(w)
	}
}

// overloadChart draws, per scenario, the adaptive limit over time and
// each target's client TTFT (median per second) over time.
func overloadChart(scs []olScenario, runs [][]olRun) []byte {
	const pw, ph = 460, 240
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`, 2*pw, len(scs)*ph+20)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>`)
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"}
	for i, sc := range scs {
		y0 := i*ph + 30
		d := runs[i][0].d.Seconds()
		limits := map[string][][2]float64{}
		ttfts := map[string][][2]float64{}
		var names []string
		for _, r := range runs[i] {
			names = append(names, r.target)
			for _, l := range r.limits {
				limits[r.target] = append(limits[r.target], [2]float64{l.at.Seconds(), l.v})
			}
			perSec := map[int][]float64{}
			for _, q := range r.reqs {
				if q.complete {
					perSec[int(q.at.Seconds())] = append(perSec[int(q.at.Seconds())], q.ttft)
				}
			}
			for s := 0; s < int(d); s++ {
				if vs := perSec[s]; len(vs) > 0 {
					ttfts[r.target] = append(ttfts[r.target], [2]float64{float64(s) + 0.5, pctl(vs, 50)})
				}
			}
		}
		timePanel(&b, sc.name+" · limit", limits, names, colors, chartPad, y0, pw-chartPad-20, ph-chartPad-40, d, false)
		timePanel(&b, sc.name+" · client TTFT p50 (log ms)", ttfts, names, colors, pw+chartPad, y0, pw-chartPad-20, ph-chartPad-40, d, true)
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// timePanel draws series (x: seconds, y: value) over [0, d] s.
func timePanel(b *bytes.Buffer, title string, series map[string][][2]float64, names, colors []string, x0, y0, w, h int, d float64, logY bool) {
	ymax := 1.0
	for _, s := range series {
		for _, p := range s {
			ymax = math.Max(ymax, p[1])
		}
	}
	yv := func(v float64) float64 { return v / (ymax * 1.1) }
	if logY {
		yv = func(v float64) float64 { return math.Log10(math.Max(v, 1)) / math.Log10(ymax*1.5) }
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">%s</text>`, x0, y0-10, esc(title))
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`, x0, y0, w, h)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%.0f</text><text x="%d" y="%d">%.0f s</text>`, x0-4, y0+8, ymax, x0+w-20, y0+h+14, d)
	for k, n := range names {
		var pts []string
		for _, p := range series[n] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", float64(x0)+float64(w)*p[0]/d, float64(y0+h)-float64(h)*yv(p[1])))
		}
		if len(pts) == 0 {
			continue
		}
		c := colors[k%len(colors)]
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, c, strings.Join(pts, " "))
		fmt.Fprintf(b, `<text x="%d" y="%d" fill="%s">%s</text>`, x0+w-150, y0+14+13*k, c, esc(n))
	}
}

// overloadSolo is the solo measurement of the overload scenario name (or
// overload-all): its report, and its chart written beside -chart as
// bench-overload.svg. Each run lasts -duration (bench/README.md's
// figures: 40 s).
func overloadSolo(name string) func(bin string, c *command) (func(io.Writer), error) {
	return func(bin string, c *command) (func(io.Writer), error) {
		scs, runs, err := measureOverload(bin, name, c.s.duration)
		if err != nil {
			return nil, err
		}
		chart := filepath.Join(filepath.Dir(c.chart), "bench-overload.svg")
		if err := os.WriteFile(chart, overloadChart(scs, runs), 0o644); err != nil {
			return nil, err
		}
		return func(w io.Writer) { overloadReport(w, scs, runs); fmt.Fprintf(w, "Chart: %s\n", chart) }, nil
	}
}
