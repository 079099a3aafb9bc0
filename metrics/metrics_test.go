package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// described returns the names of every metric m declares.
func described(m *Metrics) map[string]bool {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range []prometheus.Collector{m.Requests, m.Attempts, m.Retries, m.RetryWait, m.GiveUps, m.BreakerState,
			m.BreakerTransitions, m.EndpointInFlight, m.EndpointUp, m.HealthChecks, m.RideThroughs, m.TimeToFirstByte, m.Duration, m.InFlight, m.OpenStreams, m.ConfigReloads,
			m.Failovers, m.Cooldowns, m.BudgetExhausted, m.TargetSkips, m.RateLimited} {
			c.Describe(ch)
		}
		close(ch)
	}()
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if s := fq.FindStringSubmatch(d.String()); s != nil {
			names[s[1]] = true
		}
	}
	return names
}

func TestNamesFollowPrometheusConventions(t *testing.T) {
	m := New()
	for name := range described(m) {
		if !strings.HasPrefix(name, "sturdy_") {
			t.Errorf("%s lacks the sturdy_ prefix", name)
		}
	}
	for _, c := range []string{"sturdy_requests_total", "sturdy_upstream_attempts_total", "sturdy_retries_total",
		"sturdy_breaker_transitions_total", "sturdy_retry_stops_total", "sturdy_config_reloads_total"} {
		if !described(m)[c] {
			t.Errorf("counter %s missing", c)
		}
	}
}

func TestDashboardUsesOnlyExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	names := described(New())
	ref := regexp.MustCompile(`sturdy_[a-z_]+`)
	seen := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range ref.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")
				if !names[base] {
					t.Errorf("panel %q uses %s, which Sturdy does not export", p.Title, n)
				}
				seen++
			}
		}
	}
	if seen == 0 {
		t.Fatal("dashboard references no metrics")
	}
}

func TestStatusClass(t *testing.T) {
	for status, want := range map[int]string{200: "2xx", 301: "3xx", 404: "4xx", 499: "4xx", 503: "5xx", 0: "1xx"} {
		if got := StatusClass(status); got != want {
			t.Errorf("StatusClass(%d) = %s, want %s", status, got, want)
		}
	}
}
