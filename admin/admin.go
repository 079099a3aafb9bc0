// Package admin serves Sturdy's operator endpoints on their own listener
// (loopback by default, never the public port): Prometheus metrics,
// liveness and readiness, upstream state, and Go's pprof.
package admin

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"sturdy/proxy"
)

// Handler returns the admin mux:
//
//	/healthz          200 while the process serves
//	/readyz           200 when every route has a target whose breaker is not open, else 503 (and while draining)
//	/metrics          Prometheus exposition of reg
//	/debug/upstreams  JSON state of each upstream (breaker, counts, in-flight)
//	/debug/pprof/     Go's profiler
func Handler(p *proxy.Proxy, reg *prometheus.Registry) http.Handler {
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
	mux.HandleFunc("GET /debug/upstreams", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]any{"upstreams": p.Upstreams()})
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
