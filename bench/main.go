// Command bench is Sturdy's fault-injection load harness. It runs a
// scenario — a fault regime of the fake model server and the load to send
// through it — against the fake server directly, through Sturdy, and
// through any peer proxy (nginx, HAProxy) in the same run, and reports
// them side by side: a Markdown table on stdout, a JSON file and an SVG
// latency chart.
//
//	go run ./bench -scenario overhead
//	go run ./bench -scenario all -duration 20s
//	go run ./bench -scenario flaky -target http://127.0.0.1:8080 -fake http://127.0.0.1:18000
//	bench/peers/run.sh overhead        # adds nginx and HAProxy
//
// Scenarios: overhead, fleet, tracing, flaky, ratelimited, outage, storm,
// streams, replicas, and the solo measurements cancel, idle, hostile,
// rescue, chaos and the overload ones (overload, capacity-drop,
// long-outputs, priorities, noisy-neighbour; overload-all runs the five)
// and tokens (see bench/README.md). Load is open-loop where a rate
// is given (latency is measured from each request's scheduled start: no
// coordinated omission) and closed-loop otherwise; connections are kept
// alive.
//
//	main.go        flags, targets (direct, Sturdy, peers), a run over scenarios; Sturdy built and started
//	scenario.go    the scenarios: fault profile, load runs, Sturdy's YAML, figures
//	load.go        the load generator (open and closed loop) and its records
//	fakes.go       the fake model servers of a run (one, or a replica pool), Redis (and its command count) and OTLP for it
//	interleave.go  -slices: the targets measured in turns, each slice's CPU, RSS and Redis commands
//	report.go      the Markdown table, the JSON file and the SVG latency chart
//	proc.go        CPU and peak RSS of a target's processes
//	cancel.go      solo: how soon a client's leaving closes the upstream connection
//	idle.go        solo: memory of idle keep-alive client connections: by default, all at full speed, all lean
//	hostile.go     solo: what a client or an upstream controls, thrown at one Sturdy
//	rescue.go      solo: streams cut mid-answer, continued on a fallback
//	chaos.go       solo: the chaos property test's generator through direct, Sturdy and the peers
//	overload.go    solo: the overload scenarios (adaptive and fixed concurrency against a server that queues), their chart
//	gpu.go         the overload scenarios' fake GPU server: slots, a FIFO queue inside that never refuses
//	overload_nginx.go  nginx in front of it with max_conns (started by the overload scenarios when installed)
//	tokens.go      solo: token budgets under 50 clients (post-hoc counter, one Sturdy, two sharing Redis), their latency
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sturdy/internal/fakellm"
)

// target is one thing load is sent through.
type target struct {
	name string
	url  string
	// direct targets the fake server itself (its URL is known per run).
	direct bool
	// pids lists the processes whose CPU and memory are measured (none
	// for the fake server itself).
	pids func() []int
	// start, if set, starts the target for a scenario in front of the
	// upstream endpoints and returns the URL it serves on and its stop
	// function.
	start func(sc *scenario, upstreams []string) (url string, stop func(), err error)
	// peer marks a -peer proxy; scenarioURL holds its URL for scenarios
	// it serves on another listener (a replica pool's), by scenario name.
	peer        bool
	scenarioURL map[string]string
}

// startFor starts t (when it is started by the bench) in front of fk's
// servers for sc and returns the URL it serves on and its stop.
func (t target) startFor(sc *scenario, fk fakes) (url string, stop func(), err error) {
	url, stop = t.urlFor(sc), func() {}
	if t.direct {
		url = fk.servers[0].URL // a pool's first replica, one of the healthy ones
	}
	if t.start != nil {
		url, stop, err = t.start(sc, fk.urls())
	}
	return url, stop, err
}

// urlFor returns the URL the target serves scenario sc on.
func (t target) urlFor(sc *scenario) string {
	if u := t.scenarioURL[sc.name]; u != "" {
		return u
	}
	return t.url
}

// peerFlag collects -peer name=url[@comm] and name/scenario=url.
type peerFlag []target

func (p *peerFlag) String() string { return "" }

// Set adds a peer (name=url[@comm]) or, with name/scenario=url, the URL an
// already named peer serves one scenario on.
func (p *peerFlag) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want name=url[@comm] or name/scenario=url, got %q", v)
	}
	u, comm, _ := strings.Cut(rest, "@")
	u = strings.TrimSuffix(u, "/")
	if peer, sc, ok := strings.Cut(name, "/"); ok {
		for i := range *p {
			if t := &(*p)[i]; t.name == peer {
				t.scenarioURL[sc] = u
				return nil
			}
		}
		return fmt.Errorf("-peer %s: name %s=url first", v, peer)
	}
	t := target{name: name, url: u, peer: true, scenarioURL: map[string]string{}}
	if comm != "" {
		t.pids = func() []int { return pidsByComm(comm) }
	}
	*p = append(*p, t)
	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// command is the command line of one bench run.
type command struct {
	s                           settings
	name, fakeListen, sturdyBin string
	// baseBin is another sturdy build measured beside this one (-base).
	baseBin string
	// built are the directories of the builds this run made, removed as
	// it ends.
	built                            []string
	sturdyListen, targetURL, fakeURL string
	out, chart                       string
	noDirect                         bool
	tries                            int
	seed                             int64
	slices                           int
	peers                            peerFlag
}

// parseCommand reads the flags.
func parseCommand(args []string, stderr io.Writer) (*command, error) {
	c := &command{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.name, "scenario", "overhead", "overhead, fleet, tracing, flaky, ratelimited, outage, storm, streams, replicas, all, cancel, rescue, idle, hostile, chaos, or overload, capacity-drop, long-outputs, priorities, noisy-neighbour, overload-all, tokens")
	fs.IntVar(&c.slices, "slices", 1, "overhead, fleet, tracing: cut each run into this many slices and measure the targets in turns, one slice each")
	fs.IntVar(&c.tries, "tries", 100, "tries of the cancel and rescue scenarios; latency turns of tokens (at most 5); connections of idle (e.g. 10000); hostile's scale (models of 4 MiB; ×1000 keys; ×2 MiB of stream); ×10 requests of chaos")
	fs.Int64Var(&c.seed, "seed", 1, "chaos: the seed of its fault schedules and kills (the same for every target)")
	fs.DurationVar(&c.s.duration, "duration", 10*time.Second, "length of each load run")
	fs.Float64Var(&c.s.rate, "rate", 2000, "requests per second of the overhead latency run")
	fs.IntVar(&c.s.conns, "conns", 32, "connections of closed-loop runs")
	fs.IntVar(&c.s.streams, "streams", 1000, "concurrent streams of the streams scenario")
	fs.IntVar(&c.s.storm, "clients", 200, "concurrent clients of the storm scenario")
	fs.StringVar(&c.fakeListen, "fake-listen", "127.0.0.1:18000", "address of the fake model server (peer configs point here)")
	fs.StringVar(&c.sturdyBin, "sturdy", "", "sturdy binary to measure (default: build this checkout)")
	fs.StringVar(&c.baseBin, "base", "", "another sturdy binary (an earlier commit's build) measured beside this one as target base, its ratios printed")
	fs.StringVar(&c.sturdyListen, "sturdy-listen", "auto", "address Sturdy listens on during the run (auto: a free loopback port)")
	fs.StringVar(&c.targetURL, "target", "", "measure only this URL (a proxy you started in front of -fake)")
	fs.StringVar(&c.fakeURL, "fake", "", "with -target: the fake server's URL, for its counters")
	fs.BoolVar(&c.noDirect, "no-direct", false, "skip the direct (no proxy) baseline")
	fs.StringVar(&c.out, "out", "bench-results.json", "JSON results file")
	fs.StringVar(&c.chart, "chart", "bench-latency.svg", "SVG latency CDF chart")
	fs.Var(&c.peers, "peer", "also measure a peer proxy: name=url[@process-name], repeatable; name/scenario=url: its URL for one scenario")
	return c, fs.Parse(args)
}

func run(args []string, stdout, stderr io.Writer) int {
	c, err := parseCommand(args, stderr)
	if err != nil {
		return 2
	}
	defer func() {
		for _, d := range c.built {
			os.RemoveAll(d)
		}
	}()
	if _, ok := solos[c.name]; ok {
		return c.runSolo(c.name, stdout, stderr)
	}
	todo := scenarios
	if c.name != "all" {
		sc := findScenario(c.name)
		if sc == nil {
			fmt.Fprintf(stderr, "unknown scenario %q\n", c.name)
			return 2
		}
		todo = []*scenario{sc}
	}
	targets, err := c.targets()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	var results []scenarioResult
	for _, sc := range todo {
		sc, stop, err := withServices(sc)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", sc.name, err)
			return 1
		}
		defer stop()
		res := scenarioResult{Scenario: sc.name, About: sc.about}
		if ts := targetsFor(sc, targets, stderr); c.slices > 1 && sc.interleave && c.targetURL == "" {
			trs, err := runInterleaved(sc, c.s, ts, c.fakeListen, c.slices, stderr)
			if err != nil {
				fmt.Fprintf(stderr, "%s: %v\n", sc.name, err)
				return 1
			}
			res.Targets = trs
		} else {
			for _, t := range ts {
				tr, err := runTarget(sc, c.s, t, c.fakeListen, c.fakeURL, c.targetURL != "", stderr)
				if err != nil {
					fmt.Fprintf(stderr, "%s via %s: %v\n", sc.name, t.name, err)
					return 1
				}
				res.Targets = append(res.Targets, tr)
			}
		}
		writeMarkdown(stdout, res)
		results = append(results, res)
	}
	if err := c.write(results); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stderr, "wrote %s and %s\n", c.out, c.chart)
	return 0
}

// solos are the measurements that run Sturdy alone, one try at a time,
// instead of a load run (not in all): each measures tries and returns
// the report to print.
var solos = map[string]func(bin string, c *command) (report func(io.Writer), err error){
	// cancel: how soon a client's leaving closes the upstream connection.
	"cancel": func(bin string, c *command) (func(io.Writer), error) {
		delays, err := measureCancel(bin, c.tries)
		return func(w io.Writer) { cancelReport(w, delays) }, err
	},
	// idle: what tries (say 10000) idle keep-alive client connections
	// cost in memory: by default (lean past server.reduce_memory_above),
	// every one at full speed, every one lean (server.reduce_memory).
	"idle": func(bin string, c *command) (func(io.Writer), error) {
		var rs []idleResult
		for _, server := range idleSettings(c.tries) {
			r, err := measureIdle(bin, c.tries, server)
			if err != nil {
				return nil, err
			}
			rs = append(rs, r)
		}
		return func(w io.Writer) { idleReport(w, rs) }, nil
	},
	// hostile: what a client or an upstream controls, thrown at one
	// Sturdy: its peak memory and another client's p99 in each attack.
	"hostile": func(bin string, c *command) (func(io.Writer), error) {
		attacks, err := measureHostile(bin, c.tries)
		return func(w io.Writer) { hostileReport(w, attacks) }, err
	},
	// rescue: streams cut mid-answer, continued on a fallback.
	"rescue": func(bin string, c *command) (func(io.Writer), error) {
		ts, err := measureRescue(bin, c.tries)
		return func(w io.Writer) { rescueReport(w, ts) }, err
	},
	// The overload scenarios: a fake GPU server that queues instead of
	// failing, directly and through Sturdy (adaptive, fixed).
	"overload":        overloadSolo("overload"),
	"capacity-drop":   overloadSolo("capacity-drop"),
	"long-outputs":    overloadSolo("long-outputs"),
	"priorities":      overloadSolo("priorities"),
	"noisy-neighbour": overloadSolo("noisy-neighbour"),
	"overload-all":    overloadSolo("overload-all"),
	// tokens: token budgets under 50 clients, against a counter after
	// the fact, and the latency they add.
	"tokens": tokensSolo,
	// chaos: the chaos property test's generator, longer, through direct,
	// Sturdy and the peers: client-visible failures and amplification.
	"chaos": func(bin string, c *command) (func(io.Writer), error) {
		runs, err := measureChaos(bin, c)
		return func(w io.Writer) { chaosReport(w, c, runs) }, err
	},
}

// runSolo runs the solo measurement name and prints its report.
func (c *command) runSolo(name string, stdout, stderr io.Writer) int {
	bin, err := c.sturdyBinary()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	report, err := solos[name](bin, c)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	report(stdout)
	return 0
}

// sturdyBinary is -sturdy, or a build of this checkout.
func (c *command) sturdyBinary() (string, error) {
	if c.sturdyBin != "" {
		return c.sturdyBin, nil
	}
	return c.buildSturdy()
}

// targets lists what the run measures: one -target, or direct, Sturdy
// (built from this checkout unless -sturdy names a binary) and the peers.
func (c *command) targets() ([]target, error) {
	if c.targetURL != "" {
		return []target{{name: "target", url: strings.TrimSuffix(c.targetURL, "/")}}, nil
	}
	var targets []target
	if !c.noDirect {
		targets = append(targets, target{name: "direct", direct: true})
	}
	bin := c.sturdyBin
	if bin == "" {
		var err error
		if bin, err = c.buildSturdy(); err != nil {
			return nil, err
		}
	}
	targets = append(targets, sturdyTarget("sturdy", bin, c.sturdyListen))
	if c.baseBin != "" {
		targets = append(targets, sturdyTarget("base", c.baseBin, "auto"))
	}
	return append(targets, c.peers...), nil
}

// write saves the JSON results and the latency chart.
func (c *command) write(results []scenarioResult) error {
	if c.out != "" {
		b, _ := json.MarshalIndent(map[string]any{"machine": machine(), "settings": c.s.json(), "results": results}, "", "  ")
		if err := os.WriteFile(c.out, b, 0o644); err != nil {
			return err
		}
	}
	if c.chart != "" {
		return os.WriteFile(c.chart, latencyChart(results), 0o644)
	}
	return nil
}

// targetsFor lists the targets sc runs through: the run's targets, each
// of the scenario's Sturdy variants right after Sturdy, less the peers
// without a URL for a replica pool (their default listener is in front of
// the one fake server, which a pool scenario does not start).
func targetsFor(sc *scenario, targets []target, stderr io.Writer) []target {
	var out []target
	for _, t := range targets {
		if t.peer && len(sc.replicas) > 0 && t.scenarioURL[sc.name] == "" {
			fmt.Fprintf(stderr, "%s via %s: skipped, no -peer %s/%s=URL for its pool\n", sc.name, t.name, t.name, sc.name)
			continue
		}
		out = append(out, t)
		if t.start != nil && t.name == "sturdy" {
			for _, v := range sc.variants {
				out = append(out, v.of(t))
			}
		}
	}
	return out
}

// runTarget runs every load run of sc through t, each against fresh fake
// servers: the scenario's one, or one per replica of its pool (started
// even with -target: nothing else would start them).
func runTarget(sc *scenario, s settings, t target, fakeListen, fakeURL string, external bool, stderr io.Writer) (targetResult, error) {
	tr := targetResult{Target: t.name}
	for _, spec := range sc.runs(s) {
		var fk fakes
		if !external || len(sc.replicas) > 0 {
			var err error
			if fk, err = startFakes(sc, s, fakeListen); err != nil {
				return tr, err
			}
		}
		url, stop, err := t.startFor(sc, fk)
		if err != nil {
			fk.close()
			return tr, err
		}
		fk.reset() // the outage window and counters start with the load
		tr.Runs = append(tr.Runs, measureRun(sc, s, spec, t, url, fk, fakeURL, stderr))
		stop()
		fk.close()
	}
	return tr, nil
}

// measureRun runs one load against url and summarizes it with the fake
// servers' counters (each replica's share of them for a pool) and the
// proxy processes' CPU and memory.
func measureRun(sc *scenario, s settings, spec runSpec, t target, url string, fk fakes, fakeURL string, stderr io.Writer) runResult {
	var pids []int
	if t.pids != nil {
		pids = t.pids()
	}
	cpu0 := procCPU(pids)
	recs, elapsed := runLoad(s, spec, url, 1, fmt.Sprintf("%s/%s via %s", sc.name, spec.name, t.name), stderr)
	var st fakellm.Stats
	var each []fakellm.Stats
	switch {
	case len(fk.servers) > 0:
		st, each = fk.stats()
	case fakeURL != "":
		st = fetchStats(fakeURL)
	}
	rr := summarize(spec, recs, elapsed, st, procCPU(pids)-cpu0, procPeakRSS(pids), len(pids) > 0)
	if sc.figures != nil {
		rr.Figures = sc.figures(s, spec, recs, st)
	}
	rr.Figures = append(rr.Figures, fk.shares(st, each)...)
	return rr
}

// runLoad runs spec's load against url for 1/slices of the run's length,
// telling its progress under label.
func runLoad(s settings, spec runSpec, url string, slices int, label string, stderr io.Writer) ([]record, time.Duration) {
	body := chatBody
	switch {
	case spec.body != nil:
		body = spec.body
	case spec.stream:
		body = streamBody
	}
	window := s.duration
	if spec.window > 0 {
		window = spec.window
	}
	start := time.Now()
	recs := load{url: url + spec.path, body: body, rate: spec.rate, workers: spec.conns,
		duration: window / time.Duration(slices), once: spec.once, progress: func(sent, done int64) {
			fmt.Fprintf(stderr, "\r%-60s %4.0fs  sent %7d  done %7d", label, time.Since(start).Seconds(), sent, done)
		}}.run()
	elapsed := time.Since(start)
	fmt.Fprintf(stderr, "\r%-60s done: %d requests in %.1fs%20s\n", label, len(recs), elapsed.Seconds(), "")
	return recs, elapsed
}

// fetchStats reads the counters of the fake server at url (-fake), zero
// if it cannot.
func fetchStats(url string) fakellm.Stats {
	var st fakellm.Stats
	resp, err := http.Get(strings.TrimSuffix(url, "/") + "/_stats")
	if err == nil {
		_ = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
	}
	return st
}

// buildSturdy builds this checkout's sturdy binary into a temp dir,
// removed as the run ends: the binary that ships, built as the Dockerfile
// builds it (static, without symbols), so its memory is the shipped one's
// (a cgo build maps the C library too: 1.7 MiB more resident).
func (c *command) buildSturdy() (string, error) {
	dir, err := os.MkdirTemp("", "sturdy-bench")
	if err != nil {
		return "", err
	}
	c.built = append(c.built, dir)
	bin := filepath.Join(dir, "sturdy")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Dir = repoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building sturdy: %v\n%s", err, out)
	}
	return bin, nil
}

// repoRoot finds the module root from the working directory.
func repoRoot() string {
	dir, _ := os.Getwd()
	for d := dir; d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return dir
}

// sturdyTarget is target name: the sturdy binary bin run with each scenario's settings, on
// listen ("auto": a free loopback port, picked again if another process
// takes it first).
func sturdyTarget(name, bin, listen string) target {
	var pid int
	return target{
		name: name,
		pids: func() []int { return []int{pid} },
		start: func(sc *scenario, upstreams []string) (string, func(), error) {
			for try := 1; ; try++ {
				addr := listen
				if addr == "auto" {
					var err error
					if addr, err = freeAddr(); err != nil {
						return "", nil, err
					}
				}
				stop, exited, err := startSturdy(bin, addr, sc, upstreams, &pid)
				switch {
				case err == nil:
					return "http://" + addr, stop, nil
				case exited && listen == "auto" && try < 3:
					continue // lost a race for the port
				default:
					return "", nil, err
				}
			}
		},
	}
}

// startSturdy starts one sturdy process listening on addr, its upstream
// "fake" the upstreams (url: for one, endpoints: for a pool), and waits
// until it accepts connections; exited tells whether it died trying.
func startSturdy(bin, addr string, sc *scenario, upstreams []string, pid *int) (stop func(), exited bool, err error) {
	admin, err := freeAddr()
	if err != nil {
		return nil, false, err
	}
	return startSturdyAt(bin, addr, admin, sc, upstreams, pid)
}

// startSturdyAt is startSturdy with its admin listener on admin.
func startSturdyAt(bin, addr, admin string, sc *scenario, upstreams []string, pid *int) (stop func(), exited bool, err error) {
	if len(upstreams) == 0 {
		return nil, false, fmt.Errorf("sturdy: no upstream to proxy to")
	}
	dir, err := os.MkdirTemp("", "sturdy-bench-cfg")
	if err != nil {
		return nil, false, err
	}
	path := filepath.Join(dir, "sturdy.yaml")
	if err := os.WriteFile(path, []byte(sturdyConfig(addr, admin, sc, upstreams)), 0o600); err != nil {
		return nil, false, err
	}
	cmd := exec.Command(bin, "-config", path)
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		return nil, false, err
	}
	*pid = cmd.Process.Pid
	done, stop := stopper(cmd, dir)
	for end := time.Now().Add(10 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return stop, false, nil
		}
		select {
		case <-done:
			os.RemoveAll(dir)
			return nil, true, fmt.Errorf("sturdy exited before listening on %s: %s", addr, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(end) {
			stop()
			return nil, false, fmt.Errorf("sturdy did not listen on %s", addr)
		}
	}
}

// stopper waits for a started cmd in the background: done is closed when
// it has exited; stop interrupts it, waits, and removes its dir.
func stopper(cmd *exec.Cmd, dir string) (done chan struct{}, stop func()) {
	done = make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return done, func() {
		_ = cmd.Process.Signal(os.Interrupt)
		<-done
		os.RemoveAll(dir)
	}
}

// sturdyConfig is the config a measured Sturdy runs: listening on addr
// and admin, its upstream fake the fake servers at upstreams (a pool of
// two for a pool scenario with one), then the scenario's own.
func sturdyConfig(addr, admin string, sc *scenario, upstreams []string) string {
	if sc.pool && len(upstreams) == 1 {
		// The one fake server twice, by address and by name: a pool of two.
		upstreams = append(upstreams, strings.Replace(upstreams[0], "127.0.0.1", "localhost", 1))
	}
	where := "url: " + upstreams[0]
	if len(upstreams) > 1 {
		where = "endpoints: [" + strings.Join(upstreams, ", ") + "]"
	}
	timeouts := sc.timeouts
	if timeouts == "" {
		timeouts = "{connect: 1s, first_byte: 30s, idle: 30s}"
	}
	return fmt.Sprintf("listen: %s\nadmin_listen: %s\nlog: {level: warn}\nupstreams:\n  - name: fake\n    %s\n"+
		"    max_connections: 4096\n    timeouts: %s\n%s", addr, admin, where, timeouts, sc.sturdy)
}

// startSolo starts Sturdy on a free loopback port for a solo measurement,
// its upstream the server at up.
func startSolo(bin string, sc *scenario, up net.Addr) (addr string, pid int, stop func(), err error) {
	if addr, err = freeAddr(); err != nil {
		return "", 0, nil, err
	}
	stop, _, err = startSturdy(bin, addr, sc, []string{"http://" + up.String()}, &pid)
	return addr, pid, stop, err
}

// freeAddr returns a free loopback address to listen on.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
