// Package admin serves Sturdy's operator endpoints on their own listener
// (loopback by default, never the public port): Prometheus metrics,
// liveness and readiness, upstream state and the last failed requests (as
// JSON and as a live status page), and — opt-in — Go's pprof.
// It is bounded like the client listener: a few connections at most
// (MaxConnections, counted in the proxy's file-descriptor budget), read,
// write and idle timeouts, a profile of at most a minute. The probes are
// answered whatever holds the other connections. With a token set,
// everything but the probes needs it.
//
// admin.go holds the mux (Handler), its bounds (Server) and the settings
// that hot-reload (Settings); listener.go bounds its connections (Serve,
// Listener: idle ones make room, a reserve for the probes); status.html
// is the status page,
// embedded (no external assets), which reads /debug/upstreams and
// /debug/failures and renders them.
package admin

import (
	_ "embed"

	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"log"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"sturdy/policy"
	"sturdy/proxy"
)

// Settings are what the admin endpoints allow; a reload may change them
// (Handler reads them per request).
type Settings struct {
	// Pprof serves Go's profiler under /debug/pprof/. Default off.
	Pprof bool
	// Token, when set, is required as "Authorization: Bearer <token>" by
	// /debug/* and /metrics; /healthz and /readyz stay open for probes.
	Token string
	// AllowedHosts are server.allowed_hosts, lower case: names beyond
	// localhost a request on a loopback address may carry as its Host
	// or Origin (policy.LocalHost, LocalOrigin).
	AllowedHosts []string
}

// The admin listener's bounds.
const (
	// MaxConnections caps the admin listener's open connections,
	// ProbeReserve of them for the probes (see Listener); past it a new
	// connection takes an idle one's place, or is closed.
	MaxConnections = proxy.AdminConnections
	// ReadTimeout bounds reading a request, headers and body.
	ReadTimeout = 10 * time.Second
	// ReadHeaderTimeout bounds reading a request's line and headers.
	ReadHeaderTimeout = 5 * time.Second
	// WriteTimeout bounds writing a response (a profile's or trace's:
	// its seconds, plus this).
	WriteTimeout = 30 * time.Second
	// IdleTimeout bounds a keep-alive connection between requests.
	IdleTimeout = 5 * time.Second
	// MaxProfileSeconds caps a CPU profile's or an execution trace's
	// seconds, so no request holds the profiler for long.
	MaxProfileSeconds = 60
)

// Server returns the admin server for h (from Handler), with its
// timeouts; serve it with Serve.
func Server(h http.Handler, errorLog *log.Logger) *http.Server {
	// No WriteTimeout on the server: each response sets its own write
	// deadline (see bounded), so a profile may run longer than 30 s.
	return &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, ReadTimeout: ReadTimeout, IdleTimeout: IdleTimeout,
		MaxHeaderBytes: 64 << 10, ErrorLog: errorLog}
}

// Handler returns the admin mux:
//
//	/healthz          200 while the process serves
//	/readyz           200 when every route has a target whose breaker is not open, else 503 (and while draining)
//	/metrics          Prometheus exposition of reg                                      (token)
//	/ and /status     the status page (static: its data comes from the two below)
//	/debug/upstreams  JSON state of each upstream (breaker, counts, in-flight)          (token)
//	/debug/failures   JSON: the last failed requests, their decision trails (at most 50) (token)
//	/debug/clients    JSON: the clients holding token budgets, most used first; ?page=, ?per_page= (≤ 500) (token)
//	/debug/pprof/     Go's profiler, when settings say so; seconds at most 60           (token)
//
// settings is asked on every request, so a reload applies at once.
func Handler(p *proxy.Proxy, reg *prometheus.Registry, settings func() Settings) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if p.Draining() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: shutting down\n"))
			return
		}
		if ok, notReady := p.Ready(); !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: every target of route(s) " + strings.Join(notReady, ", ") + " has an open circuit breaker\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	mux.Handle("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.RefreshBreakerGauges()
		metrics.ServeHTTP(w, r)
	}))
	mux.Handle("GET /debug/upstreams", jsonOf("upstreams", func() any { return p.Upstreams() }))
	mux.Handle("GET /debug/failures", jsonOf("failures", func() any { return p.Failures() }))
	mux.HandleFunc("GET /debug/clients", func(w http.ResponseWriter, r *http.Request) {
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		perPage, err := strconv.Atoi(r.URL.Query().Get("per_page"))
		if err != nil {
			perPage = 50
		}
		jsonOf("clients", func() any { return p.Clients(page, perPage) }).ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /{$}", servePage)
	mux.HandleFunc("GET /status", servePage)
	prof := http.NewServeMux()
	prof.HandleFunc("/debug/pprof/", pprof.Index)
	prof.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	prof.HandleFunc("/debug/pprof/profile", pprof.Profile)
	prof.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	prof.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/debug/pprof/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !settings().Pprof {
			http.Error(w, "pprof is off (admin.pprof: true turns it on)", http.StatusNotFound)
			return
		}
		prof.ServeHTTP(w, r)
	}))
	return bounded(local(guarded(reserved(mux), settings), settings))
}

// jsonOf serves {"name": value()} as indented JSON.
func jsonOf(name string, value func() any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]any{name: value()})
	})
}

// servePage serves the status page: nothing but the page itself (no
// external script, style or frame), never cached.
func servePage(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'")
	h.Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(statusPage)
}

// statusPage is the status page (status.html).
//
//go:embed status.html
var statusPage []byte

// open are the paths served without the token: the probes, and the status
// page, which holds no data (it asks for the token and reads the rest with
// it).
func open(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/" || path == "/status"
}

// guarded asks for the token, when one is set, on every path but the
// probes. Tokens are compared as SHA-256 digests in constant time.
func guarded(h http.Handler, settings func() Settings) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token := settings().Token; token != "" && !open(r.URL.Path) {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			want, have := sha256.Sum256([]byte(token)), sha256.Sum256([]byte(got))
			if !ok || subtle.ConstantTimeCompare(want[:], have[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sturdy admin"`)
				http.Error(w, "this admin endpoint needs \"Authorization: Bearer <admin.token>\"", http.StatusUnauthorized)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// local refuses, on a loopback address, a request whose Host or Origin
// is not a local name (policy.LocalHost, LocalOrigin): a web page that
// rebinds its name to 127.0.0.1 would read the admin JSON otherwise.
// The admin listener grants no cross-origin calls.
func local(h http.Handler, settings func() Settings) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
			allowed := settings().AllowedHosts
			origin := r.Header.Get("Origin")
			if !policy.LocalHost(r.Host, allowed) || origin != "" && !policy.LocalOrigin(origin, r.Host, allowed) {
				http.Error(w, "the admin listener is on a loopback address, and this request's Host or Origin is not a local name "+
					"(a web page rebinding its name?); if the name is yours, add it to server.allowed_hosts", http.StatusForbidden)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// bounded gives each response its write deadline — WriteTimeout, or for
// a profile its seconds (at most MaxProfileSeconds) plus WriteTimeout —
// and caps those seconds: the CPU profile's and the trace's, and a delta
// profile's (heap, allocs, block, mutex, goroutine with ?seconds=).
func bounded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := WriteTimeout
		if strings.HasPrefix(r.URL.Path, "/debug/pprof/") {
			q := r.URL.Query()
			secs, err := strconv.ParseFloat(q.Get("seconds"), 64)
			if err != nil || secs <= 0 {
				secs = map[string]float64{"/debug/pprof/profile": 30, "/debug/pprof/trace": 1}[r.URL.Path] // pprof's defaults
			}
			if secs = min(secs, MaxProfileSeconds); secs > 0 {
				q.Set("seconds", strconv.FormatFloat(secs, 'f', -1, 64))
				r.URL.RawQuery = q.Encode()
				d += time.Duration(secs * float64(time.Second))
			}
		}
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
		h.ServeHTTP(w, r)
	})
}
