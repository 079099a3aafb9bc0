package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"sturdy/listener"
	"sturdy/policy"
)

// Serve serves clients on ln until Shutdown: the proxy's server behind a
// listener guard (package listener), and its lean twin for the
// connections opened past server.reduce_memory_above (a Handoff).
func (p *Proxy) Serve(ln net.Listener) error {
	return p.serve(ln, nil, func(l net.Listener) net.Listener { return l })
}

// ServeTLS is Serve over TLS with the PEM certificate and key files. The
// guard sits below TLS, so a refused connection is answered over TLS too.
func (p *Proxy) ServeTLS(ln net.Listener, certFile, keyFile string) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	return p.serve(ln, cfg, func(l net.Listener) net.Listener { return tls.NewListener(l, cfg) })
}

// serve runs the server on ln guarded (then wrapped: TLS or not) and,
// unless the server is lean itself, the lean twin on a Handoff the guard
// fills past server.reduce_memory_above open connections.
func (p *Proxy) serve(ln net.Listener, tlsConfig *tls.Config, wrap func(net.Listener) net.Listener) error {
	var lean *listener.Handoff
	if leanServer := p.leanServer(); leanServer != nil {
		lean = listener.NewHandoff(ln.Addr(), p.stopping)
		defer lean.Close()
		go func() { _ = leanServer.Serve(wrap(lean)) }()
	}
	return p.Server().Serve(wrap(listener.New(ln, p.listenerConfig(tlsConfig), lean)))
}

// listenerConfig is what the client listener is told: the server's
// bounds, and the metrics, log and refusal it reports through.
func (p *Proxy) listenerConfig(tlsConfig *tls.Config) listener.Config {
	return listener.Config{
		MaxConnections:    int64(p.limits.MaxConnections),
		ReduceMemoryAbove: int64(p.limits.ReduceMemoryAbove),
		WriteTimeout:      p.limits.WriteTimeout,
		TLS:               tlsConfig,
		Stopping:          p.stopping,
		Refusal:           p.refuse,
		AcceptError: func(reason string, err error, log bool) {
			p.m.AcceptErrors.WithLabelValues(reason).Inc()
			if log {
				p.log.Warn().Str("reason", reason).Str("error", err.Error()).
					Msg("accepting connections fails; retrying with backoff (see sturdy_accept_errors_total)")
			}
		},
		Opened:  p.m.ClientConnections.Inc,
		Closed:  p.m.ClientConnections.Dec,
		Refused: p.m.ConnectionsRefused.Inc,
	}
}

// refuse writes the answer to a connection over max_connections: 503
// too_many_connections, in no API's shape (no request was read).
func (p *Proxy) refuse(c net.Conn) {
	var resp fasthttp.Response
	e := newError(CodeTooManyConnections, p.limits.MaxConnections)
	e.retryAfter = time.Second
	e.writeTo(&resp, p.appendRequestID(nil), policy.APIOther) // before any request: no API known
	resp.SetConnectionClose()
	w := bufio.NewWriter(c)
	if resp.Write(w) == nil {
		_ = w.Flush()
	}
}
