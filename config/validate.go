package config

import (
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"sturdy/policy"
	"sturdy/tracing"
	"sturdy/upstream"
)

// problems collects what Validate finds. A key left out of the file is
// zero and takes its default where the value is used; a key written is
// checked as written, so a zero that means nothing is an error.
type problems struct {
	c  *Config
	ps []Problem
}

func (p *problems) bad(key, format string, args ...any) {
	p.ps = append(p.ps, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
}

// positive checks a duration or number that must be above 0 when written.
func positive[T Duration | time.Duration | float64](p *problems, key string, v T) {
	if v < 0 || (v == 0 && p.c.isWritten(key)) {
		p.bad(key, "must be greater than 0 (leave it out for the default)")
	}
}

// atLeast1 checks a count that must be 1 or more when written.
func atLeast1[T int | uint32 | Size](p *problems, key string, v T) {
	if v < 0 || (v == 0 && p.c.isWritten(key)) {
		p.bad(key, "must be at least 1")
	}
}

// notNegative checks a value whose 0 has a meaning of its own (note).
func notNegative[T int | int64 | float64](p *problems, key string, v T, note string) {
	if v < 0 {
		p.bad(key, "must not be negative%s", note)
	}
}

// validateSpend checks a client's spend budget (prefix: its key and a
// dot); priced says prices: is set, which a budget needs.
func validateSpend(bad func(key, format string, args ...any), prefix string, s Spend, priced bool) {
	switch {
	case s.USD < 0:
		bad(prefix+"spend.usd", "must not be negative (0: no spend budget)")
	case s.Period != "" && s.Period != "day" && s.Period != "month":
		bad(prefix+"spend.period", "must be day or month (UTC), not %q", s.Period)
	case s.USD > 0 && !priced:
		bad(prefix+"spend", "needs prices: (USD per million tokens by model glob) to count what replies cost")
	}
}

// validatePrices checks prices:, and that a client key's spend budget
// has them.
func (c *Config) validatePrices(p *problems) {
	for i, k := range c.ClientKeys {
		if k.Spend.USD > 0 && len(c.Prices) == 0 {
			p.bad("client_keys_file", "keys[%d].spend needs prices: (USD per million tokens by model glob) to count what replies cost", i)
		}
	}
	if len(c.Prices) > MaxPrices {
		p.bad("prices", "lists %d model globs, more than %d", len(c.Prices), MaxPrices)
	}
	for glob, pr := range c.Prices {
		switch {
		case strings.TrimSpace(glob) == "":
			p.bad("prices", "a model glob is empty (\"*\" matches every model)")
		case pr.Input < 0 || pr.Output < 0:
			p.bad("prices."+glob, "a price must not be negative")
		}
	}
}

// validateTokenLimits checks a client's token budgets (prefix: its key
// and a dot).
func validateTokenLimits(bad func(key, format string, args ...any), prefix string, t TokenLimits) {
	for _, f := range []struct {
		key string
		v   int64
	}{{"tokens_per_minute", t.TokensPerMinute}, {"input_tokens_per_minute", t.InputTokensPerMinute},
		{"output_tokens_per_minute", t.OutputTokensPerMinute}} {
		if f.v < 0 {
			bad(prefix+f.key, "must not be negative (0: no such budget)")
		}
	}
}

// Validate checks a decoded config and returns every problem, each naming
// its key (lines are filled in by Parse).
func (c *Config) Validate() []Problem {
	p := &problems{c: c}
	c.validateServer(p)
	c.validateSharedState(p)
	c.validateTracing(p)
	if len(c.Upstreams) == 0 {
		p.bad("upstreams", "at least one upstream is required")
	}
	names := map[string]bool{}
	for i := range c.Upstreams {
		c.validateUpstream(p, i, names)
	}
	for i, cl := range c.Clients {
		k := fmt.Sprintf("clients[%d]", i)
		if c.isWritten(k+".key_header") && strings.TrimSpace(cl.KeyHeader) == "" {
			p.bad(k+".key_header", "must not be empty (leave it out for Authorization)")
		}
		notNegative(p, k+".requests_per_second", cl.RequestsPerSecond, " (0: no request limit)")
		validateTokenLimits(p.bad, k+".", cl.TokenLimits)
		validateSpend(p.bad, k+".", cl.Spend, len(c.Prices) > 0)
		if cl.RequestsPerSecond == 0 && cl.TokensPerMinute <= 0 && cl.InputTokensPerMinute <= 0 && cl.OutputTokensPerMinute <= 0 &&
			cl.Spend.USD <= 0 {
			p.bad(k, "sets no limit: give requests_per_second, tokens_per_minute, input_tokens_per_minute, output_tokens_per_minute or spend")
		}
		if cl.RequestsPerSecond == 0 && p.c.isWritten(k+".burst") {
			p.bad(k+".burst", "is a burst of requests_per_second: set that too")
		}
		atLeast1(p, k+".burst", cl.Burst)
	}
	c.validatePrices(p)
	if len(c.Routes) == 0 && len(c.Upstreams) > 1 {
		p.bad("routes", "at least one route is required when there are several upstreams")
	}
	routeNames := map[string]bool{}
	for i := range c.Routes {
		c.validateRoute(p, i, names, routeNames)
	}
	c.validateRouteMatches(p)
	return p.ps
}

// validateServer checks the listeners, logging, TLS and auth.
func (c *Config) validateServer(p *problems) {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		p.bad("listen", "invalid address %q (want host:port or :port)", c.Listen)
	}
	if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
		key := "admin_listen"
		if c.isWritten("admin.listen") {
			key = "admin.listen"
		}
		p.bad(key, "invalid address %q (want host:port, e.g. 127.0.0.1:9090)", c.AdminListen)
	}
	if t := c.Admin.Token; t != "" && len(t) < 16 {
		p.bad("admin.token", "too short: use at least 16 characters")
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		p.bad("log.level", "unknown level %q (want debug, info, warn or error)", c.Log.Level)
	}
	switch c.Log.Format {
	case "json", "console":
	default:
		p.bad("log.format", "unknown format %q (want json or console)", c.Log.Format)
	}
	positive(p, "server.read_timeout", c.Server.ReadTimeout)
	positive(p, "server.idle_timeout", c.Server.IdleTimeout)
	positive(p, "server.write_timeout", c.Server.WriteTimeout)
	positive(p, "server.shutdown_grace", c.Server.ShutdownGrace)
	for i, s := range c.Server.TrustedProxies {
		if _, err := ParsePrefix(s); err != nil {
			p.bad(fmt.Sprintf("server.trusted_proxies[%d]", i), "%v", err)
		}
	}
	for i, h := range c.Server.AllowedHosts {
		if h == "" || strings.ContainsAny(h, "/: *") {
			p.bad(fmt.Sprintf("server.allowed_hosts[%d]", i), "%q is not a host name (no scheme, port or wildcard)", h)
		}
	}
	for i, o := range c.Server.CORSOrigins {
		rest, ok := strings.CutPrefix(o, "http://")
		if !ok {
			rest, ok = strings.CutPrefix(o, "https://")
		}
		if o != "*" && (!ok || rest == "" || strings.ContainsAny(rest, "/ ")) {
			p.bad(fmt.Sprintf("server.cors_origins[%d]", i), "%q is not an origin (http://host[:port], https://host[:port] or \"*\")", o)
		}
	}
	atLeast1(p, "server.max_connections", c.Server.MaxConnections)
	atLeast1(p, "server.reduce_memory_above", c.Server.ReduceMemoryAbove)
	atLeast1(p, "server.max_buffered_bytes", c.Server.MaxBufferedBytes)
	atLeast1(p, "server.max_request_bytes", c.Server.MaxRequestBytes)
	if h := c.Server.MaxHeaderBytes; h < 0 || (c.isWritten("server.max_header_bytes") && h < 1024) {
		p.bad("server.max_header_bytes", "must be at least 1KiB")
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		p.bad("tls", "set both cert_file and key_file, or neither")
	}
	for _, f := range []struct{ key, path string }{{"tls.cert_file", c.TLS.CertFile}, {"tls.key_file", c.TLS.KeyFile}} {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				p.bad(f.key, "cannot read %q", f.path)
			}
		}
	}
	for i, k := range c.Auth.Keys {
		if len(k) < 16 {
			p.bad(fmt.Sprintf("auth.keys[%d]", i), "too short: use at least 16 characters")
		}
	}
}

// uniqueName checks that a name is set and not used twice among kind.
func (p *problems) uniqueName(key, kind, name string, seen map[string]bool) {
	switch {
	case name == "":
		p.bad(key, "required")
	case seen[name]:
		p.bad(key, "duplicate %s name %q", kind, name)
	}
	seen[name] = true
}

// validateUpstream checks upstreams[i] and adds its name to names.
func (c *Config) validateUpstream(p *problems, i int, names map[string]bool) {
	u, k := c.Upstreams[i], fmt.Sprintf("upstreams[%d].", i)
	p.uniqueName(k+"name", "upstream", u.Name, names)
	c.validatePool(p, k, u)
	if f := u.TLS.CAFile; f != "" {
		if b, err := os.ReadFile(f); err != nil || !x509.NewCertPool().AppendCertsFromPEM(b) {
			p.bad(k+"tls.ca_file", "cannot read PEM certificates from %q", f)
		}
	}
	positive(p, k+"timeouts.connect", u.Timeouts.Connect)
	positive(p, k+"timeouts.first_byte", u.Timeouts.FirstByte)
	positive(p, k+"timeouts.idle", u.Timeouts.Idle)
	positive(p, k+"breaker.window", u.Breaker.Window)
	positive(p, k+"breaker.open_for", u.Breaker.OpenFor)
	positive(p, k+"rate_limit.max_wait", u.RateLimit.MaxWait)
	positive(p, k+"queue_timeout", u.QueueTimeout)
	positive(p, k+"cooldown.without_header", u.Cooldown.WithoutHeader)
	positive(p, k+"cooldown.max", u.Cooldown.Max)
	positive(p, k+"retry_budget.ratio", u.RetryBudget.Ratio)
	positive(p, k+"retry_budget.min_per_second", u.RetryBudget.MinPerSecond)
	atLeast1(p, k+"max_connections", u.MaxConnections)
	atLeast1(p, k+"breaker.consecutive_failures", u.Breaker.ConsecutiveFailures)
	atLeast1(p, k+"breaker.min_requests", u.Breaker.MinRequests)
	atLeast1(p, k+"breaker.half_open_requests", u.Breaker.HalfOpenRequests)
	atLeast1(p, k+"rate_limit.burst", u.RateLimit.Burst)
	if r := u.Breaker.FailureRatio; r < 0 || r > 1 || (r == 0 && c.isWritten(k+"breaker.failure_ratio")) {
		p.bad(k+"breaker.failure_ratio", "must be in (0, 1]")
	}
	notNegative(p, k+"rate_limit.requests_per_second", u.RateLimit.RequestsPerSecond, " (0 disables pacing)")
	if len(u.TokensPerMinute) > upstream.MaxTokenModels {
		p.bad(k+"tokens_per_minute", "lists %d model globs, more than %d", len(u.TokensPerMinute), upstream.MaxTokenModels)
	}
	for glob, n := range u.TokensPerMinute {
		switch {
		case strings.TrimSpace(glob) == "":
			p.bad(k+"tokens_per_minute", "a model glob is empty (\"*\" matches every model)")
		case n <= 0:
			p.bad(k+"tokens_per_minute."+glob, "must be greater than 0")
		}
	}
	notNegative(p, k+"max_in_flight", u.MaxInFlight, " (0 means unlimited)")
	c.validateConcurrency(p, k, u)
}

// validateConcurrency checks upstream u's concurrency (its key prefix k).
func (c *Config) validateConcurrency(p *problems, k string, u Upstream) {
	cc, ck := u.Concurrency, k+"concurrency."
	atLeast1(p, ck+"max", cc.Max)
	atLeast1(p, ck+"adaptive.min", cc.Adaptive.Min)
	atLeast1(p, ck+"adaptive.initial", cc.Adaptive.Initial)
	atLeast1(p, ck+"adaptive.min_samples", cc.Adaptive.MinSamples)
	atLeast1(p, ck+"queue.max", cc.Queue.Max)
	positive(p, ck+"queue.timeout", cc.Queue.Timeout)
	if t := cc.Adaptive.Tolerance; t < 0 || (t < 1 && (t != 0 || c.isWritten(ck+"adaptive.tolerance"))) {
		p.bad(ck+"adaptive.tolerance", "must be at least 1 (how much slower than its baseline a reply may start: 1.5 is half again)")
	}
	if s := cc.Adaptive.Smoothing; s < 0 || s > 1 || (s == 0 && c.isWritten(ck+"adaptive.smoothing")) {
		p.bad(ck+"adaptive.smoothing", "must be in (0, 1]")
	}
	if b := cc.BatchShare; b < 0 || b > 1 || (b == 0 && c.isWritten(ck+"batch_share")) {
		p.bad(ck+"batch_share", "must be in (0, 100 %%]")
	}
	if cc.Adaptive.Min > 0 && cc.Max > 0 && cc.Adaptive.Min > cc.Max {
		p.bad(ck+"adaptive.min", "must not be above concurrency.max (%d)", cc.Max)
	}
	if cc.Queue.Timeout > 0 && u.QueueTimeout > 0 && cc.Queue.Timeout != u.QueueTimeout {
		p.bad(ck+"queue.timeout", "is queue_timeout under another name, and they differ: set one of them")
	}
}

// validatePool checks how upstream u (its key prefix k) finds and
// balances its endpoints.
func (c *Config) validatePool(p *problems, k string, u Upstream) {
	given := 0
	for _, set := range []bool{u.URL != "", len(u.Endpoints) > 0, c.isWritten(k + "discover")} {
		if set {
			given++
		}
	}
	switch {
	case given == 0:
		p.bad(k+"url", "required: set url, endpoints or discover (e.g. url: http://127.0.0.1:11434)")
	case given > 1:
		p.bad(k+"url", "set one of url, endpoints and discover")
	case u.URL != "":
		if err := checkUpstreamURL(u.URL); err != nil {
			p.bad(k+"url", "%v", err)
		}
	case len(u.Endpoints) > 0:
		seen := map[string]bool{}
		for j, e := range u.Endpoints {
			key := fmt.Sprintf("%sendpoints[%d]", k, j)
			if err := checkUpstreamURL(e); err != nil {
				p.bad(key, "%v", err)
			} else if seen[strings.TrimSuffix(e, "/")] {
				p.bad(key, "duplicate endpoint %q", e)
			}
			seen[strings.TrimSuffix(e, "/")] = true
		}
	default:
		d := u.Discover
		if host, port, err := net.SplitHostPort(d.DNS); err != nil || host == "" || port == "" {
			p.bad(k+"discover.dns", "must be host:port (got %q)", d.DNS)
		}
		if c.isWritten(k+"discover.scheme") && d.Scheme != "http" && d.Scheme != "https" {
			p.bad(k+"discover.scheme", "must be http or https (got %q)", d.Scheme)
		}
		positive(p, k+"discover.every", d.Every)
	}
	c.validateBalance(p, k, u)
}

// validateBalance checks upstream u's balance, affinity, health_check and
// max_ejected (its key prefix k).
func (c *Config) validateBalance(p *problems, k string, u Upstream) {
	switch u.Balance { // its values are checked as it decodes (upstream.Balance)
	case upstream.BalanceAffinity:
		if (u.Affinity.Header == "") == (u.Affinity.Prefix <= 0) {
			p.bad(k+"affinity", "set one of header and prefix (e.g. affinity: {header: X-Session-Id})")
		}
	default:
		if c.isWritten(k + "affinity") {
			p.bad(k+"affinity", "applies only with balance: affinity")
		}
	}
	notNegative(p, k+"affinity.prefix", u.Affinity.Prefix, "")
	if c.isWritten(k + "health_check") {
		hc := u.HealthCheck
		if !strings.HasPrefix(hc.Path, "/") {
			p.bad(k+"health_check.path", "required, starting with / (e.g. /health)")
		}
		positive(p, k+"health_check.every", hc.Every)
		positive(p, k+"health_check.timeout", hc.Timeout)
		atLeast1(p, k+"health_check.healthy", hc.Healthy)
		atLeast1(p, k+"health_check.unhealthy", hc.Unhealthy)
	}
	// apis and continuation are checked as they decode (upstream.APIs, upstream.Continuation).
	switch strings.ToLower(u.APIKeyHeader) {
	case "", "x-api-key", "authorization":
	default:
		p.bad(k+"api_key_header", "must be x-api-key or authorization (got %q)", u.APIKeyHeader)
	}
	if m := float64(u.MaxEjected); m < 0 || m > 1 || (m == 0 && c.isWritten(k+"max_ejected")) {
		p.bad(k+"max_ejected", "must be in (0%%, 100%%] (at least one endpoint may always be ejected)")
	}
}

// validateRouteMatches refuses two routes that match the same requests
// (the same path_prefix and model): the second would never serve one.
func (c *Config) validateRouteMatches(p *problems) {
	first := map[[2]string]int{}
	for i, r := range c.Routes {
		prefix := r.PathPrefix
		if prefix == "" {
			prefix = "/"
		}
		m := [2]string{prefix, r.Model}
		j, seen := first[m]
		if !seen {
			first[m] = i
			continue
		}
		key := fmt.Sprintf("routes[%d]", i)
		if c.isWritten(key + ".path_prefix") {
			key += ".path_prefix"
		}
		what := fmt.Sprintf("path_prefix %q", prefix)
		if r.Model != "" {
			what += fmt.Sprintf(" and model %q", r.Model)
		}
		p.bad(key, "matches what routes[%d] (%s) matches, the same %s: this route would never serve a request", j, c.Routes[j].Name, what)
	}
}

// validateRoute checks routes[i] against the upstream names and adds its
// name to routeNames.
func (c *Config) validateRoute(p *problems, i int, names, routeNames map[string]bool) {
	r, k := c.Routes[i], fmt.Sprintf("routes[%d].", i)
	p.uniqueName(k+"name", "route", r.Name, routeNames)
	if c.isWritten(k+"path_prefix") && !strings.HasPrefix(r.PathPrefix, "/") {
		p.bad(k+"path_prefix", "must start with / (got %q)", r.PathPrefix)
	}
	knownUpstream := func(key, name string) {
		switch {
		case name == "":
			p.bad(key, "required")
		case !names[name]:
			p.bad(key, "unknown upstream %q (known: %s)", name, strings.Join(c.upstreamNames(), ", "))
		}
	}
	knownUpstream(k+"upstream", r.Upstream)
	for j, f := range r.Fallbacks {
		knownUpstream(fmt.Sprintf("%sfallbacks[%d].upstream", k, j), f.Upstream)
	}
	for j, st := range r.FailoverOn {
		if st < 400 || st > 499 || st == 429 {
			p.bad(fmt.Sprintf("%sfailover_on[%d]", k, j), "must be a 4xx status other than 429 (got %d)", st)
		}
	}
	positive(p, k+"deadline", r.Deadline)
	positive(p, k+"max_duration", r.MaxDuration)
	if r.MaxBody < 0 || (r.MaxBody == 0 && c.isWritten(k+"max_body")) {
		p.bad(k+"max_body", "must be at least 1 byte")
	}
	c.validateRetry(p, k+"retry.", r.Retry)
	if c.isWritten(k + "stream_hold") {
		h := r.StreamHold
		if h == (StreamHold{}) {
			p.bad(k+"stream_hold", "set max and/or bytes (e.g. stream_hold: {max: 2s, bytes: 64KiB})")
		}
		positive(p, k+"stream_hold.max", h.Max)
		atLeast1(p, k+"stream_hold.bytes", h.Bytes)
		if h.Bytes > maxStreamHold {
			p.bad(k+"stream_hold.bytes", "at most 16MiB (got %d bytes)", h.Bytes)
		}
	}
	if r.MaxRescues != nil {
		notNegative(p, k+"max_rescues", *r.MaxRescues, " (0: no rescues)")
	}
	atLeast1(p, k+"max_rescue_bytes", r.MaxRescueBytes)
}

// Warnings lists what is valid but most likely not meant, each with its
// key and line (0 for a value from a flag or the environment): a ${VAR}
// unset or empty; an upstream URL ending in /v1 — how OpenAI SDKs spell a base URL — gets
// the request path appended, so /v1/chat/completions would go to
// …/v1/v1/chat/completions.
func (c *Config) Warnings() []Problem {
	ps := append([]Problem(nil), c.unsetVars...)
	check := func(key, u string) {
		if trimmed := strings.TrimSuffix(u, "/"); strings.HasSuffix(trimmed, "/v1") {
			ps = append(ps, Problem{Key: key, Line: c.written[key], Msg: fmt.Sprintf(
				"ends in /v1, and the request's path is appended to it: /v1/chat/completions would go to %s/v1/chat/completions; "+
					"did you mean %s?", trimmed, strings.TrimSuffix(trimmed, "/v1"))})
		}
	}
	for i, u := range c.Upstreams {
		check(fmt.Sprintf("upstreams[%d].url", i), u.URL)
		for j, e := range u.Endpoints {
			check(fmt.Sprintf("upstreams[%d].endpoints[%d]", i, j), e)
		}
	}
	for i, r := range c.Routes {
		key := fmt.Sprintf("routes[%d].retry.max_total_attempts", i)
		perTarget := r.Retry.MaxAttempts
		if perTarget == 0 {
			perTarget = policy.DefaultMaxAttempts
		}
		if total := r.Retry.MaxTotalAttempts; len(r.Fallbacks) > 0 && total > 0 && total <= perTarget {
			ps = append(ps, Problem{Key: key, Line: c.written[key], Msg: fmt.Sprintf(
				"%d leaves no attempt for the fallbacks once the primary used its max_attempts (%d): they are tried only when it is skipped or refuses every connection; "+
					"leave it out for max_attempts + fallbacks (%d)", total, perTarget, perTarget+len(r.Fallbacks))})
		}
		ps = append(ps, c.unservedRoute(i)...)
	}
	return ps
}

// unservedRoute warns of routes[i] when its path_prefix is one API's
// (…/v1/messages, …/chat/completions …) and no target's upstream
// declares it in apis: every request there would be answered
// api_not_served.
func (c *Config) unservedRoute(i int) []Problem {
	r := c.Routes[i]
	api := policy.APIOf([]byte(r.PathPrefix))
	if api == policy.APIOther {
		return nil // a prefix of any API
	}
	want := "openai"
	if api == policy.APIAnthropic {
		want = "anthropic"
	}
	targets := []string{r.Upstream}
	for _, f := range r.Fallbacks {
		targets = append(targets, f.Upstream)
	}
	for _, name := range targets {
		for _, u := range c.Upstreams {
			if u.Name == name && u.APIs.Serves(api) {
				return nil
			}
		}
	}
	key := fmt.Sprintf("routes[%d].path_prefix", i)
	return []Problem{{Key: key, Line: c.written[key], Msg: fmt.Sprintf(
		"no target of this route serves %s (their upstreams' apis): every request here would be answered api_not_served", want)}}
}

// validateSharedState checks shared_state, when written.
func (c *Config) validateSharedState(p *problems) {
	s := c.SharedState
	if s == nil {
		return
	}
	const k = "shared_state."
	if !strings.HasPrefix(s.RedisURL, "redis://") && !strings.HasPrefix(s.RedisURL, "rediss://") {
		p.bad(k+"redis_url", "required: redis:// or rediss:// (e.g. redis://127.0.0.1:6379/0)")
	} else if _, err := url.Parse(s.RedisURL); err != nil {
		p.bad(k+"redis_url", "not a URL")
	}
	if (s.MasterName == "") != (len(s.SentinelAddresses) == 0) {
		p.bad(k+"master_name", "set master_name and sentinel_addresses together (Sentinel), or neither")
	}
	positive(p, k+"timeout", s.Timeout)
	if s.OnFailure != "" && s.OnFailure != "local" && s.OnFailure != "refuse" {
		p.bad(k+"on_failure", "must be local or refuse (got %q)", s.OnFailure)
	}
}

// validateTracing checks the tracing keys the file sets.
func (c *Config) validateTracing(p *problems) {
	t := c.Tracing
	const k = "tracing."
	if t.Endpoint != "" {
		if err := tracing.CheckEndpoint(t.Endpoint); err != nil {
			p.bad(k+"endpoint", "%v", err)
		}
	}
	if t.Protocol != "" {
		if err := tracing.CheckProtocol(t.Protocol); err != nil {
			p.bad(k+"protocol", "%v (got %q)", err, t.Protocol)
		}
	}
	if r := t.SampleRatio; r != nil {
		if err := tracing.CheckRatio(*r); err != nil {
			p.bad(k+"sample_ratio", "%v (got %g)", err, *r)
		}
	}
	for h := range t.Headers {
		if h == "" || strings.ContainsAny(h, " :\r\n") {
			p.bad(k+"headers", "%q is not a header name", h)
		}
	}
}

// maxStreamHold bounds stream_hold.bytes: what one request may hold.
const maxStreamHold = 16 << 20

// validateRetry checks a route's retry policy; k ends in "retry.".
func (c *Config) validateRetry(p *problems, k string, rt Retry) {
	if rt.MaxAttempts < 0 || (rt.MaxAttempts == 0 && c.isWritten(k+"max_attempts")) {
		p.bad(k+"max_attempts", "must be at least 1 (1 disables retries), got %d", rt.MaxAttempts)
	}
	atLeast1(p, k+"max_total_attempts", rt.MaxTotalAttempts)
	atLeast1(p, k+"attempts_on_client_retry", rt.AttemptsOnClientRetry)
	positive(p, k+"base_delay", rt.BaseDelay)
	positive(p, k+"max_delay", rt.MaxDelay)
	positive(p, k+"max_retry_after", rt.MaxRetryAfter)
	if rt.BaseDelay > 0 && rt.MaxDelay > 0 && rt.MaxDelay < rt.BaseDelay {
		p.bad(k+"max_delay", "must not be below base_delay (%v)", rt.BaseDelay)
	}
	if _, err := policy.ParseOnTimeout(rt.OnTimeout); err != nil || (rt.OnTimeout == "" && c.isWritten(k+"on_timeout")) {
		p.bad(k+"on_timeout", "must be failover or retry (got %q)", rt.OnTimeout)
	}
	if _, err := policy.ParseRetryOn(rt.On); err != nil {
		p.bad(k+"on", "%v", err)
	} else if rt.On != nil && len(rt.On) == 0 {
		p.bad(k+"on", "list at least one reason (to never retry, set max_attempts: 1)")
	}
}

func (c *Config) upstreamNames() []string {
	var n []string
	for _, u := range c.Upstreams {
		n = append(n, u.Name)
	}
	return n
}

// Loops lists the upstream URLs and endpoints that are Sturdy's own
// listener (IsListener): every request sent there would come back to
// Sturdy. It is checked once the listen address is final — after -listen
// and STURDY_LISTEN — not with the file's alone (Validate).
func (c *Config) Loops() []Problem {
	var ps []Problem
	check := func(key, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		if IsListener(c.Listen, u.Hostname(), port) {
			ps = append(ps, Problem{Key: key, Line: c.written[key], Msg: fmt.Sprintf(
				"%q is Sturdy's own listen address (%s): every request would come back to Sturdy (508 loop_detected); point it at the model server",
				raw, c.Listen)})
		}
	}
	for i, u := range c.Upstreams {
		if u.URL != "" {
			check(fmt.Sprintf("upstreams[%d].url", i), u.URL)
		}
		for j, e := range u.Endpoints {
			check(fmt.Sprintf("upstreams[%d].endpoints[%d]", i, j), e)
		}
	}
	return ps
}

// IsListener reports whether host:port reaches the listener at listen:
// the same port, on the listen host, or — listening on every interface —
// a loopback or unspecified address, localhost or an address of this
// host's interfaces; localhost too when the listen host is a loopback
// address.
func IsListener(listen, host, port string) bool {
	lhost, lport, err := net.SplitHostPort(listen)
	if err != nil || port != lport {
		return false
	}
	ip, lip := net.ParseIP(host), net.ParseIP(lhost)
	every := lhost == "" || lip != nil && lip.IsUnspecified()
	switch {
	case strings.EqualFold(host, lhost):
		return true
	case strings.EqualFold(host, "localhost"):
		return every || lip != nil && lip.IsLoopback()
	case ip == nil:
		return false
	case lip != nil && ip.Equal(lip):
		return true
	case !every:
		return false
	case ip.IsLoopback() || ip.IsUnspecified():
		return true
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

func checkUpstreamURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("required (e.g. http://127.0.0.1:11434)")
	}
	if !strings.Contains(raw, "://") {
		return fmt.Errorf("%q has no scheme: did you mean http://%s?", raw, raw)
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
