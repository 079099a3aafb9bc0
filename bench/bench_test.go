package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
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
	dir := t.TempDir()
	out, chart := filepath.Join(dir, "r.json"), filepath.Join(dir, "c.svg")
	var stdout, stderr bytes.Buffer
	code := run([]string{"-scenario", "all", "-duration", "1s", "-rate", "200", "-conns", "4", "-streams", "20", "-clients", "10",
		"-fake-listen", "127.0.0.1:0", "-out", out, "-chart", chart}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	for _, sc := range scenarios {
		if !strings.Contains(stdout.String(), "### "+sc.name) {
			t.Errorf("no table for %s", sc.name)
		}
	}
	var doc struct {
		Results []scenarioResult `json:"results"`
	}
	b, err := os.ReadFile(out)
	if err != nil || json.Unmarshal(b, &doc) != nil || len(doc.Results) != len(scenarios) {
		t.Fatalf("results file: %v %s", err, b)
	}
	for _, res := range doc.Results {
		for _, tr := range res.Targets {
			for _, r := range tr.Runs {
				if r.Requests == 0 {
					t.Errorf("%s/%s via %s sent nothing", res.Scenario, r.Run, tr.Target)
				}
				if res.Scenario == "overhead" && r.Success < 99 {
					t.Errorf("overhead %s via %s: %.1f%% success", r.Run, tr.Target, r.Success)
				}
				if res.Scenario == "flaky" && tr.Target == "sturdy" && r.Success < 97 {
					t.Errorf("flaky via sturdy: %.1f%% success", r.Success)
				}
				if res.Scenario == "ratelimited" && tr.Target == "sturdy" {
					for _, f := range r.Figures {
						if f.Name == "early_retries" && f.Value != 0 {
							t.Errorf("%v retries landed before Retry-After", f.Value)
						}
					}
				}
			}
		}
	}
	if svg, err := os.ReadFile(chart); err != nil || !bytes.Contains(svg, []byte("<polyline")) {
		t.Fatalf("chart: %v", err)
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
