package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestScenarioSmoke runs every scenario for a second at small counts,
// directly and through Sturdy, so the harness never rots. Full runs are
// `go run ./bench -scenario all` (bench/README.md).
func TestScenarioSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sturdy binary")
	}
	t.Parallel()
	// Each scenario on its own ports, two at a time (-parallel is
	// GOMAXPROCS): the package's run is its longest scenario's, not their
	// sum.
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			out, chart := filepath.Join(dir, "r.json"), filepath.Join(dir, "c.svg")
			var stdout, stderr bytes.Buffer
			code := run([]string{"-scenario", sc.name, "-duration", "1s", "-rate", "200", "-conns", "4", "-streams", "20", "-clients", "10",
				"-fake-listen", "127.0.0.1:0", "-out", out, "-chart", chart}, &stdout, &stderr)
			if code != 0 {
				t.Fatalf("exit %d\n%s", code, stderr.String())
			}
			if !strings.Contains(stdout.String(), "### "+sc.name) {
				t.Errorf("no table for %s", sc.name)
			}
			var doc struct {
				Results []scenarioResult `json:"results"`
			}
			b, err := os.ReadFile(out)
			if err != nil || json.Unmarshal(b, &doc) != nil || len(doc.Results) != 1 {
				t.Fatalf("results file: %v %s", err, b)
			}
			checkSmoke(t, doc.Results[0])
			if svg, err := os.ReadFile(chart); sc.name == "outage" && (err != nil || !bytes.Contains(svg, []byte("<polyline"))) {
				t.Fatalf("chart: %v", err)
			}
		})
	}
}

// checkSmoke checks what must hold of one scenario's results even in a
// second under -race: every run sent requests; Sturdy recovers what its
// retries can; the ride-through variant does at least as well as direct;
// a pool's replicas each report their share.
func checkSmoke(t *testing.T, res scenarioResult) {
	t.Helper()
	direct := map[string]float64{} // run → direct success
	seen := map[string]bool{}
	for _, tr := range res.Targets {
		seen[tr.Target] = true
		for _, r := range tr.Runs {
			if tr.Target == "direct" {
				direct[r.Run] = r.Success
			}
		}
	}
	if res.Scenario == "outage" && !seen["sturdy+ride_through"] {
		t.Errorf("outage has no sturdy+ride_through target: %v", seen)
	}
	for _, tr := range res.Targets {
		for _, r := range tr.Runs {
			at := res.Scenario + "/" + r.Run + " via " + tr.Target
			if r.Requests == 0 {
				t.Errorf("%s sent nothing", at)
			}
			low := res.Scenario == "overhead" && r.Success < 99 ||
				(res.Scenario == "flaky" || res.Scenario == "replicas") && tr.Target == "sturdy" && r.Success < 97 ||
				tr.Target == "sturdy+ride_through" && r.Success < direct[r.Run]
			if low {
				t.Errorf("%s: %.1f%% success (direct %.1f%%)", at, r.Success, direct[r.Run])
			}
			shares := 0.0
			for _, f := range r.Figures {
				if f.Name == "early_retries" && f.Value != 0 && tr.Target == "sturdy" {
					t.Errorf("%s: %v retries landed before Retry-After", at, f.Value)
				}
				if strings.HasPrefix(f.Name, "share_") {
					shares += f.Value
				}
			}
			if res.Scenario == "replicas" && math.Abs(shares-100) > 0.01 {
				t.Errorf("%s: replica shares add up to %.2f%%: %v", at, shares, r.Figures)
			}
		}
	}
}

// TestPeerFlag parses -peer: a peer, then its URL for one scenario.
func TestPeerFlag(t *testing.T) {
	var p peerFlag
	for _, v := range []string{"nginx=http://127.0.0.1:18081/@nginx", "nginx/replicas=http://127.0.0.1:18083"} {
		if err := p.Set(v); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
	}
	if err := p.Set("haproxy/replicas=http://127.0.0.1:18084"); err == nil {
		t.Errorf("a scenario URL for a peer not named yet was taken")
	}
	if len(p) != 1 || p[0].pids == nil || !p[0].peer {
		t.Fatalf("peers: %+v", p)
	}
	got := []string{p[0].urlFor(findScenario("replicas")), p[0].urlFor(findScenario("flaky"))}
	if want := []string{"http://127.0.0.1:18083", "http://127.0.0.1:18081"}; !slices.Equal(got, want) {
		t.Errorf("URLs %v, want %v", got, want)
	}
}

// TestReplicaAddr puts replica i on the fake server's port + 1 + i, where
// the peers' replica configs point; port 0 stays any free port.
func TestReplicaAddr(t *testing.T) {
	for _, tt := range []struct {
		listen string
		i      int
		want   string
	}{{"127.0.0.1:18000", 0, "127.0.0.1:18001"}, {"127.0.0.1:18000", 3, "127.0.0.1:18004"}, {"127.0.0.1:0", 2, "127.0.0.1:0"}} {
		if got, err := replicaAddr(tt.listen, tt.i); err != nil || got != tt.want {
			t.Errorf("replicaAddr(%q, %d) = %q, %v; want %q", tt.listen, tt.i, got, err, tt.want)
		}
	}
}

// TestIdleSmoke runs the idle measurement with a few connections: each
// setting (the default, all at full speed, all lean) reports a row.
func TestIdleSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sturdy binary")
	}
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-scenario", "idle", "-tries", "20"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	for _, row := range []string{"| default | 20 |", "| reduce_memory_above: 120 | 20 |", "| reduce_memory: true | 20 |"} {
		if !strings.Contains(stdout.String(), row) {
			t.Fatalf("no %q row:\n%s", row, stdout.String())
		}
	}
}

// TestCancelSmoke runs the cancel measurement for a few tries: a client
// that leaves must get the upstream connection closed, soon.
func TestCancelSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sturdy binary")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-scenario", "cancel", "-tries", "5"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "### cancel") || !strings.Contains(stdout.String(), "| 5 |") {
		t.Fatalf("no cancel table:\n%s", stdout.String())
	}
}

func TestRatiosDivideSturdyByEachPeer(t *testing.T) {
	res := scenarioResult{Targets: []targetResult{
		{Target: "sturdy", Runs: []runResult{{Run: "capacity", Throughput: 90, CPUPerRequest: 40}, {Run: "streamed", Throughput: 10},
			{Run: "latency@2000/s", Throughput: 2000, P50: 1.2}}},
		{Target: "nginx", Runs: []runResult{{Run: "capacity", Throughput: 100, CPUPerRequest: 32}, {Run: "latency@2000/s", Throughput: 2000, P50: 1}}},
		{Target: "floor", Runs: []runResult{{Run: "capacity", Throughput: 120, CPUPerRequest: 36}, {Run: "streamed", Throughput: 20}}},
	}}
	got := ratios(res)
	want := []string{"- capacity: Sturdy ÷ nginx: req/s 0.90×, CPU/req 1.25×; ÷ floor: req/s 0.75×, CPU/req 1.11×",
		"- latency@2000/s: Sturdy ÷ nginx: p50 1.20×"}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestHostileSmoke runs the hostile attacks small: each reports, the loop
// is answered 508, and Sturdy's memory stays far below the attacks'
// bytes.
func TestHostileSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sturdy binary")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-scenario", "hostile", "-tries", "3"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"### hostile", "| N1 |", "| N2 |", "| N4 |", "| N6 |", "508 in"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	t.Log(out)
}

// TestChaosSmoke runs the chaos scenario small, directly and through
// Sturdy: a table, and no request failing through Sturdy (the promise the
// chaos property test holds in proxy/).
func TestChaosSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sturdy binary")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-scenario", "chaos", "-tries", "10", "-seed", "3", "-fake-listen", "127.0.0.1:0"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"### chaos", "| direct |", "| sturdy | 0 | 0.00 % |"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	t.Log(out)
}

// TestOverloadSmoke runs the overload scenario for a second a target: a
// table with every target, the fake GPU server never erring, and no
// request failing through Sturdy.
func TestOverloadSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sturdy binary")
	}
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-scenario", "overload", "-duration", "1s", "-chart", filepath.Join(t.TempDir(), "c.svg")}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"### overload", "| direct |", "| sturdy fixed 8 |", "| sturdy fixed 9 |"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Split(line, " | "); strings.HasPrefix(line, "| sturdy") && (len(f) < 9 || f[7] != "0") {
			t.Fatalf("failures through Sturdy (the 8th column): %s", line)
		}
	}
	t.Log(out)
}

// TestTokensSmoke runs the tokens scenario for 3 s a target: a row per
// target, Sturdy settling exactly what the server served, no usage chunk
// a client did not ask for, the small key's first request admitted, and
// the leased budget costing Redis some calls, but less than a command a
// request.
func TestTokensSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sturdy binary")
	}
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-scenario", "tokens", "-duration", "3s", "-tries", "1"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"| post-hoc counter |", "| sturdy |", "| sturdy ×2, one Redis |", "| sturdy ×2, one Redis, leased |", "| budget (Redis) |"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, " | ")
		if !strings.HasPrefix(line, "| sturdy") || len(f) != 12 {
			continue
		}
		rows++
		if f[8] != "0" || !strings.HasPrefix(f[9], "true") || f[10] != "admitted" {
			t.Fatalf("a usage chunk unasked, a settlement off, or the small key refused: %s", line)
		}
		// A leased budget still calls (its first lease at least): 0 is a
		// count that failed (redisOps reads 0 when INFO does not answer).
		if ops, err := strconv.ParseFloat(strings.TrimSuffix(f[11], " |"), 64); strings.Contains(f[0], "leased") && (err != nil || ops <= 0 || ops >= 1) {
			t.Fatalf("the leased budget cost %v Redis commands a request (want above 0 and under 1): %s", ops, line)
		}
	}
	if rows != 3 {
		t.Fatalf("%d Sturdy rows of 12 columns, want 3:\n%s", rows, out)
	}
	t.Log(out)
}
