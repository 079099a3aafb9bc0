package metrics

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// registered returns the names of the metrics m's registry holds: each
// collector of m's fields is offered to it again, and one it already
// holds is in (a vector with no series yet is absent from a scrape, so a
// scrape cannot tell). shared_state's gauge is enabled first: it is
// registered only while shared_state is on.
func registered(t *testing.T, m *Metrics) map[string]bool {
	t.Helper()
	m.EnableSharedState(true)
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok || v.Field(i).Type() == reflect.TypeFor[*prometheus.Registry]() {
			continue
		}
		var are prometheus.AlreadyRegisteredError
		if err := m.Registry.Register(c); !errors.As(err, &are) {
			t.Errorf("%s is not in the registry (Register: %v)", v.Type().Field(i).Name, err)
			m.Registry.Unregister(c)
			continue
		}
		ch := make(chan *prometheus.Desc, 8)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if s := fq.FindStringSubmatch(d.String()); s != nil {
				names[s[1]] = true
			}
		}
	}
	return names
}

// TestSharedStateUpIsAbsentWithoutSharedState: a single replica has no
// sturdy_shared_state_up series, so an alert on 0 cannot fire for it.
func TestSharedStateUpIsAbsentWithoutSharedState(t *testing.T) {
	m := New()
	has := func() bool {
		fams, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "sturdy_shared_state_up" {
				return true
			}
		}
		return false
	}
	if has() {
		t.Fatal("sturdy_shared_state_up without shared_state")
	}
	m.EnableSharedState(true)
	m.EnableSharedState(true) // a reload that keeps it on
	if !has() {
		t.Fatal("no sturdy_shared_state_up with shared_state on")
	}
	m.EnableSharedState(false)
	if has() {
		t.Fatal("sturdy_shared_state_up after shared_state went off")
	}
}

func TestNamesFollowPrometheusConventions(t *testing.T) {
	m := New()
	names := registered(t, m)
	for name := range names {
		if !strings.HasPrefix(name, "sturdy_") {
			t.Errorf("%s lacks the sturdy_ prefix", name)
		}
	}
	for _, c := range []string{"sturdy_requests_total", "sturdy_upstream_attempts_total", "sturdy_retries_total",
		"sturdy_breaker_transitions_total", "sturdy_retry_stops_total", "sturdy_config_reloads_total"} {
		if !names[c] {
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
	names := registered(t, New())
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
