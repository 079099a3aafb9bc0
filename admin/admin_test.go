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
	"sturdy/proxy"
	"sturdy/upstream"
)

// stack is Sturdy and its admin listener, both on loopback.
type stack struct {
	p         *proxy.Proxy
	url       string
	adminURL  string
	admin     *Listener
	upstreams []*upstreamtest.Server
}

// waitConns waits, at most 10 s, until n of the admin listener's open
// connections match.
func (s *stack) waitConns(t *testing.T, n int, what string, match func(c *conn, now time.Time) bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.admin.mu.Lock()
		got, now := 0, time.Now()
		for c := range s.admin.open {
			if match(c, now) {
				got++
			}
		}
		s.admin.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d admin connections %s after 10 s, want %d", got, what, n)
		}
	}
}

func start(t *testing.T, openFor time.Duration, steps ...upstreamtest.Step) *stack {
	t.Helper()
	return startWith(t, Settings{Pprof: true}, openFor, steps...)
}

// startWith starts a stack whose admin endpoints allow s.
func startWith(t *testing.T, s Settings, openFor time.Duration, steps ...upstreamtest.Step) *stack {
	t.Helper()
	up := upstreamtest.Start(t, steps...)
	m := metrics.New()
	p, err := proxy.New(proxy.Options{
		Upstreams: []upstream.Options{{Name: "model", URL: up.URL, Timeouts: upstream.Timeouts{Connect: time.Second, FirstByte: 2 * time.Second,
			Idle: time.Second}, MaxConnections: 16,
			Breaker: breaker.Settings{ConsecutiveFailures: 3, MinRequests: 1000, OpenFor: openFor}}},
		Routes: []proxy.Route{{Name: "chat", PathPrefix: "/", Upstream: "model", Deadline: 5 * time.Second, MaxBody: 1 << 20,
			Retry: proxy.Retry{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond,
				MaxRetryAfter: time.Second}}},
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
	srv := Server(Handler(p, m.Registry, func() Settings { return s }), nil)
	l := newListener(ln)
	go func() { _ = serve(srv, l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &stack{p: p, url: upstreamtest.ServeWith(t, p.Serve, func() { _ = p.Shutdown(context.Background()) }), adminURL: "http://" + ln.Addr().String(),
		admin: l, upstreams: []*upstreamtest.Server{up}}
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
		Upstreams []upstream.Status `json:"upstreams"`
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

// TestPprofIsOffByDefault: without admin.pprof the profiler is not
// served (it was, unauthenticated, wherever the admin port reached).
func TestPprofIsOffByDefault(t *testing.T) {
	t.Parallel()
	s := startWith(t, Settings{}, time.Minute, upstreamtest.Step{Body: "{}"})
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/profile?seconds=1", "/debug/pprof/cmdline"} {
		if code, _ := get(t, s.adminURL+path); code != 404 {
			t.Errorf("%s: %d with pprof off", path, code)
		}
	}
}

// TestATokenGuardsAllButTheProbes: with admin.token set, /metrics and
// /debug/* need it as a bearer token; /healthz and /readyz do not.
func TestATokenGuardsAllButTheProbes(t *testing.T) {
	t.Parallel()
	const token = "admin-token-0123456789"
	s := startWith(t, Settings{Pprof: true, Token: token}, time.Minute, upstreamtest.Step{Body: "{}"})
	ask := func(path, auth string) int {
		req, _ := http.NewRequest("GET", s.adminURL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), token) {
			t.Fatalf("%s: the token is in the body", path)
		}
		return resp.StatusCode
	}
	for _, path := range []string{"/metrics", "/debug/upstreams", "/debug/clients", "/debug/pprof/"} {
		for _, auth := range []string{"", "Bearer wrong-token-0123456789", token, "Basic " + token} {
			if code := ask(path, auth); code != 401 {
				t.Errorf("%s with %q: %d, want 401", path, auth, code)
			}
		}
		if code := ask(path, "Bearer "+token); code != 200 {
			t.Errorf("%s with the token: %d", path, code)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code := ask(path, ""); code != 200 {
			t.Errorf("%s without a token: %d (probes must stay open)", path, code)
		}
	}
}

// TestAProfileIsAtMostAMinute: a profile's or trace's seconds are capped
// at MaxProfileSeconds, and its write deadline follows them.
func TestAProfileIsAtMostAMinute(t *testing.T) {
	t.Parallel()
	var got []string
	h := bounded(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = append(got, r.URL.Query().Get("seconds")) }))
	for _, path := range []string{"/debug/pprof/profile?seconds=86400", "/debug/pprof/trace?seconds=5", "/debug/pprof/profile",
		"/debug/pprof/heap?seconds=86400", "/debug/pprof/heap"} {
		req, _ := http.NewRequest("GET", "http://admin"+path, nil)
		h.ServeHTTP(nopWriter{}, req)
	}
	if strings.Join(got, ",") != "60,5,30,60," {
		t.Fatalf("seconds as served: %v, want 60,5,30,60 and none", got)
	}
}

type nopWriter struct{}

func (nopWriter) Header() http.Header         { return http.Header{} }
func (nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (nopWriter) WriteHeader(int)             {}

// TestTheAdminServersTimeouts: idle connections go quickly.
func TestTheAdminServersTimeouts(t *testing.T) {
	t.Parallel()
	if srv := Server(http.NotFoundHandler(), nil); srv.ReadTimeout != 10*time.Second || srv.IdleTimeout != 5*time.Second ||
		srv.ReadHeaderTimeout != 5*time.Second {
		t.Fatalf("admin server timeouts: %+v", srv)
	}
}

// probe sends one GET for path on a new connection to addr and returns
// its status (0: no answer within 2 s).
func probe(addr, path string) int {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestIdleAdminConnectionsDoNotLockOutTheProbes: with MaxConnections
// admin connections open and idle (nothing sent, or a request trickled
// in part), each probe takes the oldest one's place and is answered.
// Before, they waited in the backlog: 35 of 35 liveness probes failed
// over 70 s, and the chart's probe would restart a healthy process.
func TestIdleAdminConnectionsDoNotLockOutTheProbes(t *testing.T) {
	t.Parallel()
	s := startWith(t, Settings{Token: "secret"}, time.Minute, upstreamtest.Step{Body: "{}"})
	addr := strings.TrimPrefix(s.adminURL, "http://")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < MaxConnections+16; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			_, _ = io.WriteString(c, "GET /metrics HTTP/1.1\r\n") // a request begun, never ended
		}
		conns = append(conns, c)
	}
	// Within newGrace of its accept a silent connection counts as on its
	// way, and keeps its place: wait until every one may give it up.
	s.waitConns(t, MaxConnections-ProbeReserve, "idle", (*conn).idle)
	for i := 0; i < 10; i++ {
		for _, path := range []string{"/healthz", "/readyz"} {
			if code := probe(addr, path); code != 200 {
				t.Fatalf("probe %d of %s: %d with %d idle admin connections", i, path, code, len(conns))
			}
		}
	}
}

// TestBusyAdminConnectionsLeaveTheProbesAReserve: with every other place
// busy serving a request, a probe is answered from the reserve, where
// anything else gets 503 and a connection past the reserve is closed at
// once rather than left waiting.
func TestBusyAdminConnectionsLeaveTheProbesAReserve(t *testing.T) {
	t.Parallel()
	s := start(t, time.Minute, upstreamtest.Step{Body: "{}"})
	addr := strings.TrimPrefix(s.adminURL, "http://")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < MaxConnections-ProbeReserve; i++ { // each busy for 30 s, or until closed
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, "GET /debug/pprof/heap?seconds=30 HTTP/1.1\r\nHost: x\r\n\r\n")
		conns = append(conns, c)
	}
	// A connection whose request the server has not read yet counts as
	// new, and past newGrace as idle: wait until every one is busy.
	s.waitConns(t, MaxConnections-ProbeReserve, "serving a request", func(c *conn, _ time.Time) bool { return c.state == http.StateActive })
	if code := probe(addr, "/debug/upstreams"); code != 503 {
		t.Fatalf("/debug/upstreams from the reserve: %d, want 503", code)
	}
	if code := probe(addr, "/healthz"); code != 200 {
		t.Fatalf("/healthz with every other place busy: %d", code)
	}
	inReserve := func(c *conn, _ time.Time) bool { return c.probe }
	s.waitConns(t, 0, "in the reserve", inReserve) // the probes' own, closed
	// The reserve, taken by clients that send nothing.
	for i := 0; i < ProbeReserve; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	s.waitConns(t, ProbeReserve, "in the reserve", inReserve)
	start := time.Now()
	if code := probe(addr, "/healthz"); code != 0 || time.Since(start) > time.Second {
		t.Fatalf("past every place: %d after %v, want the connection closed at once", code, time.Since(start))
	}
	time.Sleep(ProbeDeadline)
	s.waitConns(t, 0, "in the reserve", inReserve) // its holders are cut
	if code := probe(addr, "/healthz"); code != 200 {
		t.Fatalf("/healthz once the reserve's holders were cut: %d", code)
	}
}

// TestTheAdminListenerRefusesForeignHostsAndOrigins: on a loopback
// address the admin JSON answers only local names and pages (and
// server.allowed_hosts). Before, /debug/failures answered a foreign
// Host: a web page rebinding its name could read it.
func TestTheAdminListenerRefusesForeignHostsAndOrigins(t *testing.T) {
	t.Parallel()
	s := startWith(t, Settings{AllowedHosts: []string{"box.lan"}}, time.Minute, upstreamtest.Step{Body: "{}"})
	for _, tt := range []struct {
		host, origin string
		want         int
	}{
		{"rebind.attacker.example", "", 403},
		{"127.0.0.1", "https://attacker.example", 403},
		{"127.0.0.1", "", 200},
		{"localhost:9090", "http://localhost:9090", 200},
		{"box.lan", "", 200},
	} {
		req, _ := http.NewRequest("GET", s.adminURL+"/debug/failures", nil)
		req.Host = tt.host
		if tt.origin != "" {
			req.Header.Set("Origin", tt.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("Host %q, Origin %q: %d, want %d", tt.host, tt.origin, resp.StatusCode, tt.want)
		}
	}
}
