package proxy

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"sturdy/metrics"
	"sturdy/policy"
	"sturdy/upstream"
)

// table is one generation of configuration: the routes and the
// upstreams they use. A request works with the table it started with, so
// a reload never changes a request in flight.
type table struct {
	routes    []*route // longest prefix first
	upstreams []*upstream.Upstream
	clients   []*clientLimiter
	keys      clientKeys
	// hooks run around every request's attempt loop (hooks.go): the
	// client limits first.
	hooks    hooks
	authKeys [][sha256.Size]byte // hashes of the accepted client keys
	maxBody  int
	// trusted are the peers whose X-Forwarded-* headers are kept.
	trusted []netip.Prefix
	// allowedHosts and corsOrigins are server.allowed_hosts and
	// server.cors_origins (origin.go).
	allowedHosts, corsOrigins []string
	// models are the model names and globs the config mentions: the only
	// values the model metric label takes.
	models []string
	// prices are what models cost (prices:), for spend budgets.
	prices prices
}

// modelLabel is model as a metric label: a model the config names (a
// fallback rewrite, a route's literal model) or the route glob it
// matches, else "other" — labels never take request data.
func (t *table) modelLabel(model string) string {
	for _, m := range t.models {
		if m == model || policy.GlobMatch(m, model) {
			return m
		}
	}
	return "other"
}

// trusts reports whether peer is a trusted proxy (server.trusted_proxies).
func (t *table) trusts(peer netip.Addr) bool {
	for _, p := range t.trusted {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}

type route struct {
	// tokenPaced says a target's upstream sets tokens_per_minute: its
	// requests' usage is read (outbound.metered).
	tokenPaced bool
	// priority is its requests' class in a concurrency queue;
	// priorityHeader lets x-sturdy-priority say it instead.
	priority       upstream.Priority
	priorityHeader bool
	name           string
	prefix         []byte
	model          string // glob, or "" for any
	specificity    int    // of model; -1 without one
	targets        []target
	firstToken     time.Duration
	failoverOn     []int
	failoverCodes  []string
	clientRetries  int
	deadline       time.Duration
	maxBody        int
	maxDuration    time.Duration // 0: the defaults by kind (responseCap)
	retry          policy.Retry
	streamHold     StreamHold // off when Max is 0
	maxRescues     int
	// maxRescueBytes bounds the text a rescue keeps (max_rescue_bytes).
	maxRescueBytes int
	// Histograms of this route, resolved once.
	ttfb, durPlain, durStream prometheus.Observer
}

// target is one upstream a route may use, with its model rewrite.
type target struct {
	up    *upstream.Upstream
	model string
	// answered counts this route's requests it answered 2xx ok, the
	// common sturdy_requests_total series, resolved once.
	answered prometheus.Counter
	// pace names its upstream's rate_limit in the fleet, built once: a
	// request's concatenation would be an allocation each.
	pace string
}

// sent is the model as t gets it: its own, else the client's.
func (t *target) sent(client string) string {
	if t.model != "" {
		return t.model
	}
	return client
}

// upstream returns the upstream named name, nil when there is none.
func (t *table) upstream(name string) *upstream.Upstream {
	for _, up := range t.upstreams {
		if up.Name() == name {
			return up
		}
	}
	return nil
}

// buildTable builds a table from o (its upstreams sharing env, its
// series in m), reusing the upstreams of prev whose
// options are unchanged; it also returns prev's upstreams left out.
func buildTable(o Options, prev *table, env *upstream.Env, m *metrics.Metrics) (*table, []*upstream.Upstream, error) {
	t := &table{}
	byName, err := buildUpstreams(t, o.Upstreams, prev, env, m)
	if err != nil {
		return nil, nil, err
	}
	for _, ro := range o.Routes {
		r, err := buildRoute(ro.withDefaults(), byName, m)
		if err != nil {
			return nil, nil, err
		}
		for _, tg := range r.targets {
			if tg.model != "" && !slices.Contains(t.models, tg.model) {
				t.models = append(t.models, tg.model)
			}
		}
		if r.model != "" && !slices.Contains(t.models, r.model) {
			t.models = append(t.models, r.model)
		}
		t.routes = append(t.routes, r)
		t.maxBody = max(t.maxBody, r.maxBody)
	}
	sort.SliceStable(t.routes, func(i, j int) bool { return len(t.routes[i].prefix) > len(t.routes[j].prefix) })
	t.trusted = o.TrustedProxies
	t.allowedHosts, t.corsOrigins = o.AllowedHosts, o.CORSOrigins
	for _, k := range o.AuthKeys {
		t.authKeys = append(t.authKeys, sha256.Sum256([]byte(k)))
	}
	t.prices = buildPrices(o.Prices)
	for _, p := range t.prices {
		if !slices.Contains(t.models, p.glob) {
			t.models = append(t.models, p.glob) // a priced model is a label of its own
		}
	}
	if err := buildClients(t, o, prev, m, env.Stopping); err != nil {
		return nil, nil, err
	}
	var dropped []*upstream.Upstream
	if prev != nil {
		for _, up := range prev.upstreams {
			if byName[up.Name()] != up {
				dropped = append(dropped, up)
			}
		}
	}
	return t, dropped, nil
}

// buildClients adds o's client limits to t (clients:, client_keys_file)
// and their hooks, keeping the buckets and budgets of prev's whose
// settings did not change.
func buildClients(t *table, o Options, prev *table, m *metrics.Metrics, stop <-chan struct{}) error {
	var prevClients []*clientLimiter
	if prev != nil {
		prevClients = prev.clients
	}
	for i, co := range o.Clients {
		co = co.withDefaults()
		if i < len(prevClients) && prevClients[i].opts == co {
			t.clients = append(t.clients, prevClients[i]) // keep the buckets
			continue
		}
		cl := newClientLimiter(co, evictions(m, mapClients))
		if i < len(prevClients) {
			cl.keepBudgets(prevClients[i]) // a changed budget keeps what was spent
		}
		t.clients = append(t.clients, cl)
	}
	var prevKeys clientKeys
	if prev != nil {
		prevKeys = prev.keys
	}
	var base ClientLimit
	for _, cl := range t.clients {
		if cl.byCredential {
			base = cl.opts
			break
		}
	}
	var err error
	if t.keys, err = buildClientKeys(o.ClientKeys, base, prevKeys, evictions(m, mapClients), stop); err != nil {
		return err
	}
	if len(t.clients) > 0 || t.keys.limited() {
		t.hooks = append(t.hooks, clientLimits(t.clients))
	}
	if clientLimits(t.clients).budgeted() || t.keys.budgeted() {
		t.hooks = append(t.hooks, clientTokens(t.clients))
	}
	return nil
}

// buildUpstreams adds o's upstreams to t, reusing those of prev whose
// options are unchanged (their connections and breaker state survive);
// a changed upstream keeps the endpoints whose definition did not change.
func buildUpstreams(t *table, opts []upstream.Options, prev *table, env *upstream.Env, m *metrics.Metrics) (map[string]*upstream.Upstream, error) {
	reuse := map[string]*upstream.Upstream{}
	if prev != nil {
		for _, up := range prev.upstreams {
			reuse[up.Name()] = up
		}
	}
	byName := map[string]*upstream.Upstream{}
	for _, uo := range opts {
		uo = uo.WithDefaults()
		up := reuse[uo.Name]
		if up == nil || !reflect.DeepEqual(*up.Options(), uo) {
			var err error
			if up, err = upstream.New(env, uo, up); err != nil {
				return nil, err
			}
			for _, ep := range up.Endpoints() {
				m.BreakerState.WithLabelValues(up.Name(), ep.Addr()).Set(float64(ep.Breaker().State()))
			}
		}
		byName[uo.Name] = up
		t.upstreams = append(t.upstreams, up)
	}
	return byName, nil
}

// buildRoute builds one route (its defaults filled) over the upstreams.
func buildRoute(ro Route, byName map[string]*upstream.Upstream, m *metrics.Metrics) (*route, error) {
	retry, err := ro.Retry.Policy(len(ro.Fallbacks))
	if err != nil {
		return nil, fmt.Errorf("route %q: retry: %w", ro.Name, err)
	}
	r := &route{name: ro.Name, prefix: []byte(ro.PathPrefix), model: ro.Model, specificity: -1,
		firstToken: ro.FirstToken, failoverOn: ro.FailoverOn, failoverCodes: ro.FailoverCodes,
		clientRetries: ro.Retry.AttemptsOnClientRetry, deadline: ro.Deadline, maxBody: int(ro.MaxBody), maxDuration: ro.MaxDuration,
		retry: retry, streamHold: ro.StreamHold, maxRescues: *ro.MaxRescues,
		maxRescueBytes: int(ro.MaxRescueBytes), priority: ro.Priority, priorityHeader: ro.PriorityHeader}
	if ro.Model != "" {
		r.specificity = policy.GlobSpecificity(ro.Model)
	}
	r.ttfb = m.TimeToFirstByte.WithLabelValues(ro.Name)
	r.durPlain = m.Duration.WithLabelValues(ro.Name, "false")
	r.durStream = m.Duration.WithLabelValues(ro.Name, "true")
	for _, tg := range append([]Target{{Upstream: ro.Upstream}}, ro.Fallbacks...) {
		up := byName[tg.Upstream]
		if up == nil {
			return nil, fmt.Errorf("route %q: unknown upstream %q", ro.Name, tg.Upstream)
		}
		r.targets = append(r.targets, target{up: up, model: tg.Model, pace: "pace:" + up.Name(),
			answered: m.Requests.WithLabelValues(ro.Name, up.Name(), metrics.StatusClass(200), outcomeOK)})
		r.tokenPaced = r.tokenPaced || up.HasTokenLimits()
	}
	return r, nil
}

// fallbackAfter reports whether a target that serves api follows target
// ti (a fallback to fail over to).
func (r *route) fallbackAfter(api policy.API, ti int) bool { return r.serving(api, ti+1) >= 0 }

// serving returns the index of the first of r's targets from from on
// whose upstream serves api (its apis), or -1 when none does.
func (r *route) serving(api policy.API, from int) int {
	for i := from; i < len(r.targets); i++ {
		if r.targets[i].up.Options().APIs.Serves(api) {
			return i
		}
	}
	return -1
}

// apiName names a request's API in messages: the Messages API, or
// OpenAI's (every other path).
func apiName(api policy.API) string {
	if api == policy.APIAnthropic {
		return "Anthropic's Messages API"
	}
	return "the OpenAI API"
}

// authorized reports whether the request carries an accepted client key
// (always true without auth): some says it carries one, sum is its
// SHA-256. Every key is compared, in constant time, on
// hashes of equal length: timing tells nothing about the keys.
func (t *table) authorized(some bool, sum *[sha256.Size]byte) bool {
	if len(t.authKeys) == 0 {
		return true
	}
	match := 0
	for i := range t.authKeys {
		match |= subtle.ConstantTimeCompare(sum[:], t.authKeys[i][:])
	}
	return some && match == 1
}

// match returns the route for a request: among routes whose prefix
// starts path and whose model glob (if any) matches the body's "model",
// the longest prefix wins, then a route with a glob over one without,
// then the glob with more literal characters. The body is parsed only
// when a candidate route has a model glob.
func (t *table) match(path []byte, model gjson.Result) *route {
	var best *route
	for _, r := range t.routes {
		if best != nil && len(r.prefix) < len(best.prefix) {
			break // sorted by prefix length, longest first
		}
		if !bytes.HasPrefix(path, r.prefix) {
			continue
		}
		if r.model != "" && !policy.GlobMatch(r.model, model.String()) {
			continue
		}
		if best == nil || r.specificity > best.specificity {
			best = r
		}
	}
	return best
}

// evictions returns the callback that counts an entry of the per-key map
// name dropped to make room for a new key.
func evictions(m *metrics.Metrics, name string) func() {
	c := m.Evictions.WithLabelValues(name)
	return c.Inc
}

// prices are a table's model prices, the most literal glob first.
type prices []struct {
	glob  string
	price Price
}

func buildPrices(ps map[string]Price) prices {
	var out prices
	for g, p := range ps {
		out = append(out, struct {
			glob  string
			price Price
		}{g, p})
	}
	sort.Slice(out, func(i, j int) bool {
		if a, b := policy.GlobSpecificity(out[i].glob), policy.GlobSpecificity(out[j].glob); a != b {
			return a > b
		}
		return out[i].glob < out[j].glob
	})
	return out
}

// cost is what u costs for model (as sent), in USD; 0 when no price
// names it.
func (ps prices) cost(model string, u policy.Usage) float64 {
	for _, p := range ps {
		if policy.GlobMatch(p.glob, model) {
			return (float64(u.Input)*p.price.Input + float64(u.Output)*p.price.Output) / 1e6
		}
	}
	return 0
}
