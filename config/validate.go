package config

import (
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"sturdy/policy"
)

// Validate checks a decoded config and returns every problem, each naming
// its key (lines are filled in by Parse).
func (c *Config) Validate() []Problem {
	var ps []Problem
	bad := func(key, format string, args ...any) {
		ps = append(ps, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "invalid address %q (want host:port or :port)", c.Listen)
	}
	if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
		bad("admin_listen", "invalid address %q (want host:port, e.g. 127.0.0.1:9090)", c.AdminListen)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "unknown level %q (want debug, info, warn or error)", c.Log.Level)
	}
	switch c.Log.Format {
	case "json", "console":
	default:
		bad("log.format", "unknown format %q (want json or console)", c.Log.Format)
	}
	if len(c.Upstreams) == 0 {
		bad("upstreams", "at least one upstream is required")
	}
	if c.Server.ReadTimeout <= 0 {
		bad("server.read_timeout", "must be greater than 0")
	}
	if c.Server.IdleTimeout <= 0 {
		bad("server.idle_timeout", "must be greater than 0")
	}
	if c.Server.MaxHeaderBytes < 1024 {
		bad("server.max_header_bytes", "must be at least 1KiB")
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		bad("tls", "set both cert_file and key_file, or neither")
	}
	for _, f := range []struct{ key, path string }{{"tls.cert_file", c.TLS.CertFile}, {"tls.key_file", c.TLS.KeyFile}} {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				bad(f.key, "cannot read %q", f.path)
			}
		}
	}
	for i, k := range c.Auth.Keys {
		if len(k) < 16 {
			bad(fmt.Sprintf("auth.keys[%d]", i), "too short: use at least 16 characters")
		}
	}
	// uniqueName checks that a name is set and not used twice among kind.
	uniqueName := func(key, kind, name string, seen map[string]bool) {
		switch {
		case name == "":
			bad(key, "required")
		case seen[name]:
			bad(key, "duplicate %s name %q", kind, name)
		}
		seen[name] = true
	}
	names := map[string]bool{}
	for i, u := range c.Upstreams {
		k := fmt.Sprintf("upstreams[%d]", i)
		uniqueName(k+".name", "upstream", u.Name, names)
		if err := checkUpstreamURL(u.URL); err != nil {
			bad(k+".url", "%v", err)
		}
		if f := u.TLS.CAFile; f != "" {
			if b, err := os.ReadFile(f); err != nil || !x509.NewCertPool().AppendCertsFromPEM(b) {
				bad(k+".tls.ca_file", "cannot read PEM certificates from %q", f)
			}
		}
		positive := func(key string, d Duration) {
			if d <= 0 {
				bad(k+"."+key, "must be greater than 0")
			}
		}
		positive("timeouts.connect", u.Timeouts.Connect)
		positive("timeouts.first_byte", u.Timeouts.FirstByte)
		positive("timeouts.idle", u.Timeouts.Idle)
		positive("breaker.window", u.Breaker.Window)
		positive("breaker.open_for", u.Breaker.OpenFor)
		b := u.Breaker
		atLeast1 := func(key string, v int) {
			if v < 1 {
				bad(k+"."+key, "must be at least 1")
			}
		}
		notNegative := func(key string, v float64, note string) {
			if v < 0 {
				bad(k+"."+key, "must not be negative%s", note)
			}
		}
		atLeast1("max_connections", u.MaxConnections)
		atLeast1("breaker.consecutive_failures", b.ConsecutiveFailures)
		atLeast1("breaker.min_requests", b.MinRequests)
		atLeast1("breaker.half_open_requests", b.HalfOpenRequests)
		atLeast1("rate_limit.burst", u.RateLimit.Burst)
		if b.FailureRatio <= 0 || b.FailureRatio > 1 {
			bad(k+".breaker.failure_ratio", "must be in (0, 1]")
		}
		notNegative("rate_limit.requests_per_second", u.RateLimit.RequestsPerSecond, " (0 disables pacing)")
		notNegative("max_in_flight", float64(u.MaxInFlight), " (0 means unlimited)")
		notNegative("retry_budget.ratio", u.RetryBudget.Ratio, "")
		notNegative("retry_budget.min_per_second", u.RetryBudget.MinPerSecond, "")
	}
	for i, cl := range c.Clients {
		k := fmt.Sprintf("clients[%d]", i)
		if strings.TrimSpace(cl.KeyHeader) == "" {
			bad(k+".key_header", "required (e.g. Authorization)")
		}
		if cl.RequestsPerSecond <= 0 {
			bad(k+".requests_per_second", "must be greater than 0")
		}
		if cl.Burst < 1 {
			bad(k+".burst", "must be at least 1")
		}
	}
	if len(c.Routes) == 0 && len(c.Upstreams) > 1 {
		bad("routes", "at least one route is required when there are several upstreams")
	}
	routeNames := map[string]bool{}
	for i, r := range c.Routes {
		k := fmt.Sprintf("routes[%d]", i)
		uniqueName(k+".name", "route", r.Name, routeNames)
		if !strings.HasPrefix(r.PathPrefix, "/") {
			bad(k+".path_prefix", "must start with / (got %q)", r.PathPrefix)
		}
		knownUpstream := func(key, name string) {
			switch {
			case name == "":
				bad(key, "required")
			case !names[name]:
				bad(key, "unknown upstream %q (known: %s)", name, strings.Join(c.upstreamNames(), ", "))
			}
		}
		knownUpstream(k+".upstream", r.Upstream)
		for j, f := range r.Fallbacks {
			knownUpstream(fmt.Sprintf("%s.fallbacks[%d].upstream", k, j), f.Upstream)
		}
		for j, st := range r.FailoverOn {
			if st < 400 || st > 499 || st == 429 {
				bad(fmt.Sprintf("%s.failover_on[%d]", k, j), "must be a 4xx status other than 429 (got %d)", st)
			}
		}
		if rt := r.Retry; rt.OnTimeout != "failover" && rt.OnTimeout != "retry" {
			bad(k+".retry.on_timeout", "must be failover or retry (got %q)", rt.OnTimeout)
		}
		if r.Retry.MaxTotalAttempts < 1 {
			bad(k+".retry.max_total_attempts", "must be at least 1")
		}
		if r.Retry.AttemptsOnClientRetry < 1 {
			bad(k+".retry.attempts_on_client_retry", "must be at least 1")
		}
		if r.Deadline <= 0 {
			bad(k+".deadline", "must be greater than 0")
		}
		if r.MaxBody < 1 {
			bad(k+".max_body", "must be at least 1 byte")
		}
		rt := r.Retry
		if rt.MaxAttempts < 1 {
			bad(k+".retry.max_attempts", "must be at least 1 (1 disables retries), got %d", rt.MaxAttempts)
		}
		if rt.MaxDelay < rt.BaseDelay {
			bad(k+".retry.max_delay", "must not be below base_delay (%v)", rt.BaseDelay)
		}
		if _, err := policy.ParseRetryOn(rt.On); err != nil {
			bad(k+".retry.on", "%v", err)
		}
	}
	return ps
}

func (c *Config) upstreamNames() []string {
	var n []string
	for _, u := range c.Upstreams {
		n = append(n, u.Name)
	}
	return n
}

func checkUpstreamURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("required (e.g. http://127.0.0.1:11434)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("invalid URL %q", raw)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme must be http or https in %q", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("missing host in %q", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("must be scheme://host[:port][/prefix] with no query, fragment or user info")
	}
	return nil
}
