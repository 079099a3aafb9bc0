package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
	"sturdy/metrics"
	"sturdy/policy"
	"sturdy/proxy"
)

// stack is Sturdy and its admin listener, both on loopback.
type stack struct {
	p         *proxy.Proxy
	url       string
	adminURL  string
	upstreams []*upstreamtest.Server
}

func start(t *testing.T, openFor time.Duration, steps ...upstreamtest.Step) *stack {
	t.Helper()
	up := upstreamtest.Start(t, steps...)
	m := metrics.New()
	p, err := proxy.New(proxy.Options{
		Upstreams: []proxy.Upstream{{Name: "model", URL: up.URL, ConnectTimeout: time.Second, FirstByteTimeout: 2 * time.Second,
			IdleTimeout: time.Second, MaxConnections: 16,
			Breaker: breaker.Settings{ConsecutiveFailures: 3, MinRequests: 1000, OpenFor: openFor}}},
		Routes: []proxy.Route{{Name: "chat", PathPrefix: "/", Upstream: "model", Deadline: 5 * time.Second, MaxBody: 1 << 20,
			Retry: policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Base: time.Millisecond, Max: time.Millisecond},
				MaxRetryAfter: time.Second, On: policy.RetryOnAll}}},
		Log:     zerolog.Nop(),
		Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.CloseIdleConnections)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(p, m.Registry), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &stack{p: p, url: upstreamtest.ServeWith(t, p.Serve, func() { _ = p.Shutdown(context.Background()) }), adminURL: "http://" + ln.Addr().String(),
		upstreams: []*upstreamtest.Server{up}}
}

var get = upstreamtest.Get

func (s *stack) chat(t *testing.T) int {
	t.Helper()
	resp, err := http.Post(s.url+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// scrape reads /metrics into series → value, series written as
// name{label="v",...} exactly as exposed.
func (s *stack) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	code, body := get(t, s.adminURL+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	out := map[string]float64{}
	// The one upstream has one endpoint, on a free port: its series are
	// keyed without the endpoint label.
	endpoint := regexp.MustCompile(`endpoint="[^"]*",?`)
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad metric line %q", line)
		}
		out[strings.Replace(endpoint.ReplaceAllString(line[:i], ""), "{}", "", 1)] += v
	}
	return out
}

func TestMetricsCountAScriptedRun(t *testing.T) {
	s := start(t, time.Minute,
		upstreamtest.Step{Status: 503},                                                // request 1, attempt 1
		upstreamtest.Step{Body: "ok"},                                                 // request 1, attempt 2
		upstreamtest.Step{Status: 400, Body: "bad"},                                   // request 2
		upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After-Ms", "10"}}}, // request 3, attempt 1
		upstreamtest.Step{Body: "ok"},                                                 // request 3, attempt 2
	)
	for i, want := range []int{200, 400, 200} {
		if got := s.chat(t); got != want {
			t.Fatalf("request %d: %d, want %d", i+1, got, want)
		}
	}
	m := s.scrape(t)
	want := map[string]float64{
		`sturdy_requests_total{code="2xx",outcome="ok",route="chat",upstream="model"}`:           2,
		`sturdy_requests_total{code="4xx",outcome="pass_through",route="chat",upstream="model"}`: 1,
		`sturdy_upstream_attempts_total{result="success",upstream="model"}`:                      2,
		`sturdy_upstream_attempts_total{result="pass_through",upstream="model"}`:                 1,
		`sturdy_upstream_attempts_total{result="5xx",upstream="model"}`:                          1,
		`sturdy_upstream_attempts_total{result="429",upstream="model"}`:                          1,
		`sturdy_retries_total{reason="5xx",upstream="model"}`:                                    1,
		`sturdy_retries_total{reason="429",upstream="model"}`:                                    1,
		`sturdy_retry_wait_seconds_count{source="server",upstream="model"}`:                      1,
		`sturdy_retry_wait_seconds_count{source="backoff",upstream="model"}`:                     1,
		`sturdy_time_to_first_byte_seconds_count{route="chat"}`:                                  3,
		`sturdy_request_duration_seconds_count{route="chat",stream="false"}`:                     3,
		`sturdy_breaker_state{upstream="model"}`:                                                 0,
		`sturdy_in_flight_requests`:                                                              0,
		`sturdy_open_streams`:                                                                    0,
	}
	for series, v := range want {
		if got, ok := m[series]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, v)
		}
	}
	// Amplification is derivable: 5 attempts for 3 requests.
	var attempts, requests float64
	for k, v := range m {
		if strings.HasPrefix(k, "sturdy_upstream_attempts_total{") {
			attempts += v
		}
		if strings.HasPrefix(k, "sturdy_requests_total{") {
			requests += v
		}
	}
	if attempts != 5 || requests != 3 {
		t.Errorf("attempts %v requests %v, want 5 and 3", attempts, requests)
	}
	if _, ok := m["go_goroutines"]; !ok {
		t.Error("Go runtime metrics missing")
	}
}

// TestReadinessFlipsWithTheBreaker: readiness follows the connection
// breakers (resets here); a model's reply breaker leaves it alone.
func TestReadinessFlipsWithTheBreaker(t *testing.T) {
	s := start(t, 500*time.Millisecond, upstreamtest.Step{Fault: upstreamtest.Reset})
	if code, _ := get(t, s.adminURL+"/readyz"); code != 200 {
		t.Fatalf("/readyz %d before any failure", code)
	}
	s.chat(t) // 2 failures
	s.chat(t) // the 3rd opens the breaker
	code, body := get(t, s.adminURL+"/readyz")
	if code != 503 || !strings.Contains(body, "chat") {
		t.Fatalf("/readyz with the breaker open: %d %q", code, body)
	}
	if m := s.scrape(t); m[`sturdy_breaker_state{upstream="model"}`] != 2 || m[`sturdy_breaker_transitions_total{to="open",upstream="model"}`] != 1 {
		t.Fatalf("breaker metrics: state %v transitions %v", m[`sturdy_breaker_state{upstream="model"}`],
			m[`sturdy_breaker_transitions_total{to="open",upstream="model"}`])
	}
	if code, _ := get(t, s.adminURL+"/healthz"); code != 200 {
		t.Fatal("/healthz must stay 200 while not ready")
	}
	// Half-open counts as ready.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if code, _ := get(t, s.adminURL+"/readyz"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz never recovered after open_for")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestDebugUpstreamsAndPprof(t *testing.T) {
	s := start(t, time.Minute, upstreamtest.Step{Status: 500})
	s.chat(t)
	code, body := get(t, s.adminURL+"/debug/upstreams")
	var doc struct {
		Upstreams []proxy.UpstreamStatus `json:"upstreams"`
	}
	if err := json.Unmarshal([]byte(body), &doc); code != 200 || err != nil || len(doc.Upstreams) != 1 {
		t.Fatalf("/debug/upstreams: %d %s", code, body)
	}
	u := doc.Upstreams[0]
	// 500s are replies: the model's breaker counts them, the connection worked.
	if u.Name != "model" || u.Breaker != "closed" || u.Counts.Successes != 2 || u.URL != s.upstreams[0].URL ||
		len(u.ModelBreakers) != 1 || u.ModelBreakers[0].Failures != 2 || u.ModelBreakers[0].State != "closed" {
		t.Fatalf("status %+v", u)
	}
	if code, body := get(t, s.adminURL+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("pprof index: %d", code)
	}
}
