package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"sturdy/internal/fakellm"
)

// runResult is one load run through one target.
type runResult struct {
	Run           string   `json:"run"`
	Requests      int      `json:"requests"`
	Success       float64  `json:"success_pct"`
	Throughput    float64  `json:"throughput_rps"`
	P50           float64  `json:"p50_ms"`
	P99           float64  `json:"p99_ms"`
	P999          float64  `json:"p999_ms"`
	TTFTP50       float64  `json:"ttft_p50_ms,omitempty"`
	TTFTP99       float64  `json:"ttft_p99_ms,omitempty"`
	Upstream      int64    `json:"upstream_requests"`
	Amplification float64  `json:"amplification"`
	CPUPerRequest float64  `json:"cpu_us_per_request,omitempty"`
	PeakRSSMiB    float64  `json:"peak_rss_mib,omitempty"`
	Figures       []figure `json:"figures,omitempty"`
	// cdf is the latency distribution for the chart: (percentile, ms).
	CDF [][2]float64 `json:"cdf"`
}

type targetResult struct {
	Target string      `json:"target"`
	Runs   []runResult `json:"runs"`
}

type scenarioResult struct {
	Scenario string         `json:"scenario"`
	About    string         `json:"about"`
	Targets  []targetResult `json:"targets"`
}

func summarize(spec runSpec, recs []record, elapsed time.Duration, st fakellm.Stats, cpu time.Duration, rss int64, measured bool) runResult {
	h := latencies(recs, all, total)
	r := runResult{Run: spec.name, Requests: len(recs), Success: 100 * successRate(recs),
		Throughput: float64(len(recs)) / elapsed.Seconds(), P50: ms(h, 50), P99: ms(h, 99), P999: ms(h, 99.9),
		Upstream: st.Requests, CDF: cdf(h)}
	if len(recs) > 0 {
		r.Amplification = float64(st.Requests) / float64(len(recs))
	}
	if spec.stream {
		t := latencies(recs, ok, firstByte)
		r.TTFTP50, r.TTFTP99 = ms(t, 50), ms(t, 99)
	}
	if measured && len(recs) > 0 {
		r.CPUPerRequest = float64(cpu/time.Microsecond) / float64(len(recs))
		r.PeakRSSMiB = float64(rss) / (1 << 20)
	}
	return r
}

func cdf(h *hdrhistogram.Histogram) [][2]float64 {
	var out [][2]float64
	for _, q := range []float64{1, 5, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 100} {
		out = append(out, [2]float64{q, ms(h, q)})
	}
	return out
}

// writeMarkdown prints one scenario's table: a row per target and run.
func writeMarkdown(w io.Writer, res scenarioResult) {
	fmt.Fprintf(w, "\n### %s\n\n%s\n\n", res.Scenario, res.About)
	fmt.Fprintln(w, "| target | run | requests | success | req/s | p50 ms | p99 ms | p99.9 ms | TTFT p99 ms | upstream ×| CPU µs/req | peak RSS MiB | scenario figures |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, t := range res.Targets {
		for _, r := range t.Runs {
			var figs []string
			for _, f := range r.Figures {
				figs = append(figs, fmt.Sprintf("%s %.3g%s", f.Name, f.Value, f.Unit))
			}
			fmt.Fprintf(w, "| %s | %s | %d | %.2f%% | %.0f | %.2f | %.2f | %.2f | %s | %.2f | %s | %s | %s |\n",
				t.Target, r.Run, r.Requests, r.Success, r.Throughput, r.P50, r.P99, r.P999, orDash(r.TTFTP99),
				r.Amplification, orDash(r.CPUPerRequest), orDash(r.PeakRSSMiB), strings.Join(figs, ", "))
		}
	}
	if lines := ratios(res); len(lines) > 0 {
		fmt.Fprintln(w)
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}
}

// ratioPeers are the targets Sturdy is divided by under each table: the
// reference proxy, the floor (a bare fasthttp forwarder) and base, another
// Sturdy build measured beside this one (-base).
var ratioPeers = []string{"nginx", "floor", "base"}

// ratios says, per run, Sturdy's throughput (p50 latency for a fixed-rate
// run) and CPU per request as a multiple of each ratio peer's measured in
// the same run; the floor is left out of stream runs.
func ratios(res scenarioResult) []string {
	runs := map[string]map[string]runResult{}
	var order []string
	for _, t := range res.Targets {
		for _, r := range t.Runs {
			if runs[r.Run] == nil {
				runs[r.Run] = map[string]runResult{}
				order = append(order, r.Run)
			}
			runs[r.Run][t.Target] = r
		}
	}
	var out []string
	for _, run := range order {
		st, ok := runs[run]["sturdy"]
		if !ok {
			continue
		}
		var parts []string
		for _, peer := range ratioPeers {
			pr, ok := runs[run][peer]
			// The floor buffers whole replies: for streams nginx is the
			// reference.
			if !ok || pr.Throughput == 0 || peer == "floor" && strings.Contains(run, "stream") {
				continue
			}
			var p []string
			if strings.HasPrefix(run, "latency@") { // a fixed rate: latency, not req/s, tells them apart
				p = append(p, fmt.Sprintf("p50 %.2f×", st.P50/pr.P50))
			} else {
				p = append(p, fmt.Sprintf("req/s %.2f×", st.Throughput/pr.Throughput))
			}
			if st.CPUPerRequest > 0 && pr.CPUPerRequest > 0 {
				p = append(p, fmt.Sprintf("CPU/req %.2f×", st.CPUPerRequest/pr.CPUPerRequest))
			}
			parts = append(parts, fmt.Sprintf("÷ %s: %s", peer, strings.Join(p, ", ")))
		}
		if len(parts) > 0 {
			out = append(out, fmt.Sprintf("- %s: Sturdy %s", run, strings.Join(parts, "; ")))
		}
	}
	return out
}

func orDash(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", v)
}

// latencyChart draws each target's latency CDF, one panel per scenario
// run, as an SVG a person can open in a browser.
func latencyChart(results []scenarioResult) []byte {
	panels := chartPanels(results)
	const pw, ph = 460, 260
	cols := 2
	rows := (len(panels) + cols - 1) / cols
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`, cols*pw, rows*ph+20)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`)
	for i, p := range panels {
		p.draw(&b, float64(i%cols*pw+chartPad), float64(i/cols*ph+30), float64(pw-chartPad-20), float64(ph-chartPad-40))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// chartPad is the room left of and below each panel for its axes.
const chartPad = 50

// chartPanel is one run of one scenario: a latency CDF per target.
type chartPanel struct {
	title  string
	series map[string][][2]float64
	order  []string
}

// chartPanels makes one panel per scenario run, its targets in order.
func chartPanels(results []scenarioResult) []chartPanel {
	var panels []chartPanel
	for _, res := range results {
		runs := map[string]*chartPanel{}
		var names []string
		for _, t := range res.Targets {
			for _, r := range t.Runs {
				p := runs[r.Run]
				if p == nil {
					p = &chartPanel{title: res.Scenario + " · " + r.Run, series: map[string][][2]float64{}}
					runs[r.Run] = p
					names = append(names, r.Run)
				}
				p.series[t.Target] = r.CDF
				p.order = append(p.order, t.Target)
			}
		}
		for _, n := range names {
			panels = append(panels, *runs[n])
		}
	}
	return panels
}

// span returns the smallest positive and the largest latency of the panel.
func (p chartPanel) span() (minMs, maxMs float64) {
	maxMs = 0.001
	for _, s := range p.series {
		for _, pt := range s {
			maxMs = math.Max(maxMs, pt[1])
		}
	}
	minMs = maxMs
	for _, s := range p.series {
		for _, pt := range s {
			if pt[1] > 0 {
				minMs = math.Min(minMs, pt[1])
			}
		}
	}
	return minMs, maxMs
}

// draw writes the panel at x0, y0 with a plot area w × h: a log-ms axis,
// p50/p90/p99 lines and a polyline per target.
func (p chartPanel) draw(b *bytes.Buffer, x0, y0, w, h float64) {
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"}
	minMs, maxMs := p.span()
	lo, hi := math.Log10(math.Max(minMs/2, 0.001)), math.Log10(maxMs*1.5)
	xOf := func(v float64) float64 { return x0 + w*(math.Log10(math.Max(v, 0.001))-lo)/(hi-lo) }
	yOf := func(q float64) float64 { return y0 + h - h*q/100 }
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-weight="bold">%s — latency CDF (log ms)</text>`, x0, y0-10, esc(p.title))
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`, x0, y0, w, h)
	for e := math.Ceil(lo); e <= hi; e++ {
		x := xOf(math.Pow(10, e))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/><text x="%.1f" y="%.0f" text-anchor="middle">%g</text>`,
			x, y0, x, y0+h, x, y0+h+14, math.Pow(10, e))
	}
	for _, q := range []float64{50, 90, 99} {
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">p%g</text><line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`,
			x0-4, yOf(q)+4, q, x0, yOf(q), x0+w, yOf(q))
	}
	for k, name := range p.order {
		var pts []string
		for _, pt := range p.series[name] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(pt[1]), yOf(pt[0])))
		}
		c := colors[k%len(colors)]
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, c, strings.Join(pts, " "))
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" fill="%s">%s</text>`, x0+w-90, y0+h-10-float64(k)*13, c, esc(name))
	}
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// machine describes where the numbers came from.
func machine() map[string]any {
	m := map[string]any{"cpus": runtime.NumCPU(), "go": runtime.Version(), "os": runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				m["cpu"] = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	return m
}

func (s settings) json() map[string]any {
	return map[string]any{"duration": s.duration.String(), "rate": s.rate, "conns": s.conns, "streams": s.streams, "clients": s.storm}
}
