package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sturdy/upstream"
	"syscall"
	"testing"
	"time"
)

func TestDefaultConfigIsValid(t *testing.T) {
	c := Default("")
	if ps := c.Validate(); len(ps) > 0 {
		t.Fatalf("default config invalid: %+v", ps)
	}
	if c.Listen != ":8080" || c.AdminListen != DefaultAdminListen || c.Upstreams[0].URL != DefaultUpstreamURL ||
		len(c.Routes) != 1 || c.Routes[0].Upstream != DefaultUpstreamName {
		t.Fatalf("unexpected default: %+v", c)
	}
	// The defaults of values used elsewhere belong to the packages that use
	// them (proxy, policy, breaker): config leaves them zero.
	if r := c.Routes[0]; r.Retry.MaxAttempts != 0 || r.MaxBody != 0 || r.Deadline != 0 || r.Retry.On != nil {
		t.Fatalf("config wrote a default of its own: %+v", r)
	}
}

func TestParseKeepsWrittenValuesAndLeavesTheRestZero(t *testing.T) {
	c, err := Parse("t.yaml", []byte(`
listen: "127.0.0.1:9000"
clients:
  - {requests_per_second: 2.5}
upstreams:
  - name: a
    url: http://127.0.0.1:1/prefix/
    timeouts: {first_byte: 5s}
    rate_limit: {requests_per_second: 50}
routes:
  - name: r
    upstream: a
    max_body: 1KiB
    retry: {max_attempts: 2, on: [5xx], on_timeout: retry}
`))
	if err != nil {
		t.Fatal(err)
	}
	u := c.Upstreams[0]
	if u.Timeouts.FirstByte != 5*time.Second || u.Timeouts.Connect != 0 || u.MaxConnections != 0 ||
		u.RateLimit.RequestsPerSecond != 50 || u.RateLimit.Burst != 0 || u.QueueTimeout != 0 {
		t.Errorf("upstream: %+v", u)
	}
	r := c.Routes[0]
	if r.PathPrefix != "" || r.MaxBody != 1024 || r.Retry.MaxAttempts != 2 || len(r.Retry.On) != 1 || r.Retry.On[0] != "5xx" ||
		r.Retry.MaxDelay != 0 || r.Retry.OnTimeout != "retry" || r.Retry.MaxTotalAttempts != 0 {
		t.Errorf("route: %+v", r)
	}
	if cl := c.Clients[0]; cl.KeyHeader != "" || cl.Burst != 0 || cl.RequestsPerSecond != 2.5 {
		t.Errorf("client: %+v", cl)
	}
}

func TestAWrittenZeroIsValidatedAsWritten(t *testing.T) {
	base := "upstreams:\n  - name: a\n    url: http://h\n%s\nroutes:\n  - name: r\n    upstream: a\n%s\n"
	for _, tt := range []struct{ upstream, route, key string }{
		{"    timeouts: {connect: 0s}", "", "upstreams[0].timeouts.connect: must be greater than 0"},
		{"    queue_timeout: 0s", "", "upstreams[0].queue_timeout: must be greater than 0"},
		{"    max_connections: 0", "", "upstreams[0].max_connections: must be at least 1"},
		{"    breaker: {failure_ratio: 0}", "", "upstreams[0].breaker.failure_ratio: must be in (0, 1]"},
		{"    rate_limit: {requests_per_second: 5, burst: 0}", "", "upstreams[0].rate_limit.burst: must be at least 1"},
		{"    retry_budget: {ratio: 0}", "", "upstreams[0].retry_budget.ratio: must be greater than 0"},
		{"", "    deadline: 0s", "routes[0].deadline: must be greater than 0"},
		{"", "    max_body: 0", "routes[0].max_body: must be at least 1 byte"},
		{"", "    retry: {max_attempts: 0}", "routes[0].retry.max_attempts: must be at least 1"},
		{"", "    retry: {base_delay: 0s}", "routes[0].retry.base_delay: must be greater than 0"},
		{"", "    retry: {on: []}", "routes[0].retry.on: list at least one reason"},
		{"", "    retry: {on_timeout: \"\"}", "routes[0].retry.on_timeout: must be failover or retry"},
		{"", "    path_prefix: \"\"", "routes[0].path_prefix: must start with /"},
	} {
		_, err := Parse("t.yaml", []byte(fmt.Sprintf(base, tt.upstream, tt.route)))
		if err == nil || !strings.Contains(err.Error(), tt.key) {
			t.Errorf("%q %q: %v, want %q", tt.upstream, tt.route, err, tt.key)
		}
	}
	// Where 0 has a meaning of its own it is accepted.
	meaningful := "    rate_limit: {requests_per_second: 0}\n    max_in_flight: 0"
	if _, err := Parse("t.yaml", []byte(fmt.Sprintf(base, meaningful, "    first_token: 0s"))); err != nil {
		t.Errorf("meaningful zeros refused: %v", err)
	}
}

func TestEnvExpansion(t *testing.T) {
	t.Setenv("STURDY_TEST_KEY", "sk-test")
	t.Setenv("STURDY_TEST_PORT", "11434")
	c, err := Parse("t.yaml", []byte(`
upstreams:
  - name: a
    url: http://127.0.0.1:${STURDY_TEST_PORT}
    api_key: ${STURDY_TEST_KEY}
  - name: b
    url: http://127.0.0.1:1
    api_key: ${STURDY_TEST_UNSET_VAR}
routes: [{name: r, upstream: a}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstreams[0].APIKey != "sk-test" || c.Upstreams[0].URL != "http://127.0.0.1:11434" || c.Upstreams[1].APIKey != "" {
		t.Fatalf("expansion: %+v", c.Upstreams)
	}
	c, err = Parse("t.yaml", []byte("upstreams: [{name: a, url: 'http://h'}]\n"+
		"tracing: {endpoint: 'http://127.0.0.1:${STURDY_TEST_PORT}', headers: {authorization: 'Bearer ${STURDY_TEST_KEY}'}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tracing.Endpoint != "http://127.0.0.1:11434" || c.Tracing.Headers["authorization"] != "Bearer sk-test" {
		t.Fatalf("tracing expansion: %+v", c.Tracing)
	}
}

func TestSecretsFromFiles(t *testing.T) {
	dir := t.TempDir()
	keyFile, keysFile := dir+"/openai.key", dir+"/clients.keys"
	if err := os.WriteFile(keyFile, []byte("sk-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keysFile, []byte("# issued 2026-11\nclient-key-0000000001\n\nclient-key-0000000002\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse("t.yaml", []byte(`
upstreams: [{name: a, url: "http://h", api_key_file: "`+keyFile+`"}]
auth: {keys: [inline-key-00000001], keys_file: "`+keysFile+`"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstreams[0].APIKey != "sk-from-file" || len(c.Auth.Keys) != 3 || c.Auth.Keys[2] != "client-key-0000000002" {
		t.Fatalf("api key %q, auth keys %v", c.Upstreams[0].APIKey, c.Auth.Keys)
	}
	_, err = Parse("t.yaml", []byte("upstreams:\n  - name: a\n    url: http://h\n    api_key_file: /nonexistent/key\n"))
	if err == nil || !strings.Contains(err.Error(), "t.yaml:4: upstreams[0].api_key_file: cannot read") {
		t.Fatalf("missing key file: %v", err)
	}
	_, err = Parse("t.yaml", []byte("upstreams: [{name: a, url: 'http://h'}]\nauth:\n  keys: [short]\n"))
	if err == nil || !strings.Contains(err.Error(), "auth.keys[0]: too short") {
		t.Fatalf("short key: %v", err)
	}
}

// TestWrittenZeros: 0 is a duration without a unit (as time.ParseDuration
// reads it); slow_start's and max_rescues' written 0 mean none, left out
// or null the default (nil), and the config stays valid when validated
// again; a quoted duration may have spaces around it.
func TestWrittenZeros(t *testing.T) {
	t.Parallel()
	c, err := Parse("t.yaml", []byte("upstreams:\n  - {name: a, url: 'http://h', ride_through: 0, slow_start: 0, queue_timeout: ' 1.5s '}\n"+
		"  - {name: b, url: 'http://h', slow_start: ~, ride_through: }\nroutes:\n  - {name: r, upstream: a, max_rescues: 0}\n  - {name: s, upstream: b, path_prefix: /s, max_rescues: ~, first_token: ~}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if u := c.Upstreams[0]; u.RideThrough != 0 || u.SlowStart == nil || *u.SlowStart != 0 || u.QueueTimeout != 1500*time.Millisecond {
		t.Fatalf("%+v", u)
	}
	if c.Upstreams[1].SlowStart != nil || c.Routes[0].MaxRescues == nil || *c.Routes[0].MaxRescues != 0 || c.Routes[1].MaxRescues != nil {
		t.Fatalf("slow_start %v; max_rescues %v, %v", c.Upstreams[1].SlowStart, c.Routes[0].MaxRescues, c.Routes[1].MaxRescues)
	}
	// Validate again (as the loader's caller does): a written 0 is still valid.
	if ps := c.Validate(); len(ps) != 0 {
		t.Fatalf("a second Validate: %v", ps)
	}
}

func TestInvalidConfigsNameKeyAndLine(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string // substrings of the message, in order of lines
	}{
		{"unknown top-level key", "listen: :1\nlisten_addr: :2\nupstreams: [{name: a, url: 'http://h'}]\n",
			[]string{"t.yaml:2: listen_addr: unknown key (known: admin, admin_listen, auth, client_keys_file, clients, listen, log, prices, routes, server, shared_state, tls, tracing, upstreams)"}},
		{"unknown nested key", "upstreams:\n  - name: a\n    url: http://h\n    timeouts:\n      conect: 1s\n",
			[]string{"t.yaml:5: upstreams[0].timeouts.conect: unknown key"}},
		{"bad duration", "upstreams:\n  - name: a\n    url: http://h\n    timeouts:\n      connect: 2 seconds\n",
			[]string{`t.yaml:5: upstreams[0].timeouts.connect: invalid duration "2 seconds"`}},
		{"negative duration", "upstreams:\n  - name: a\n    url: http://h\n    timeouts: {idle: -1s}\n",
			[]string{`t.yaml:4: upstreams[0].timeouts.idle: duration "-1s" must not be negative`}},
		{"a duration without its unit, in a flow mapping", "upstreams:\n  - name: a\n    url: http://h\n    timeouts: {idle: 1s, connect: 30}\n",
			[]string{`t.yaml:4: upstreams[0].timeouts.connect: invalid duration "30"`}},
		{"a negative count", "upstreams:\n  - name: a\n    url: http://h\n    breaker: {open_for: 2s, consecutive_failures: -1}\n",
			[]string{`t.yaml:4: upstreams[0].breaker.consecutive_failures: must be at least 1`}},
		{"a negative duration through an alias", "routes:\n  - {name: r, upstream: a, failover_codes: [&neg \"-5s\"], first_token: *neg}\nupstreams:\n  - {name: a, url: http://h}\n",
			[]string{`t.yaml:2: routes[0].first_token: duration "-5s" must not be negative`}},
		{"a list for balance", "upstreams:\n  - name: a\n    url: http://h\n    balance: [x]\n",
			[]string{`t.yaml:4: upstreams[0].balance: must be least_requests, round_robin or affinity (got a list)`}},
		{"bad size", "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - name: r\n    upstream: a\n    max_body: lots\n",
			[]string{`t.yaml:5: routes[0].max_body: invalid size "lots"`}},
		{"wrong type", "upstreams:\n  - name: a\n    url: http://h\n    max_connections: many\n",
			[]string{`t.yaml:4: upstreams[0].max_connections: want an integer, got "many"`}},
		{"a wrong type hides nothing else", "upstreams:\n  - name: a\n    url: http://h\n    max_connections: lots\nroutes:\n  - {name: r, upstream: nope}\n",
			[]string{`t.yaml:4: upstreams[0].max_connections: want an integer, got "lots"`, `t.yaml:6: routes[0].upstream: unknown upstream "nope"`}},
		{"a tab is reported on its line", "upstreams:\n  - name: a\n\turl: http://h\n",
			[]string{"t.yaml:3: a tab in the indentation: YAML indents with spaces"}},
		{"a URL without a scheme", "upstreams:\n  - name: a\n    url: 127.0.0.1:11434\n",
			[]string{`t.yaml:3: upstreams[0].url: "127.0.0.1:11434" has no scheme: did you mean http://127.0.0.1:11434?`}},
		{"unknown upstream in route", "upstreams:\n  - name: a\n    url: http://h\nroutes:\n  - name: r\n    upstream: b\n",
			[]string{`t.yaml:6: routes[0].upstream: unknown upstream "b" (known: a)`}},
		{"max_attempts below 1", "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - name: r\n    upstream: a\n    retry:\n      max_attempts: 0\n",
			[]string{"t.yaml:6: routes[0].retry.max_attempts: must be at least 1"}},
		{"bad retry reason", "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - name: r\n    upstream: a\n    retry: {on: [5xx, 4xx]}\n",
			[]string{`t.yaml:5: routes[0].retry.on: unknown retry reason "4xx"`}},
		{"bad url scheme", "upstreams:\n  - name: a\n    url: ftp://h\n",
			[]string{"t.yaml:3: upstreams[0].url: scheme must be http or https"}},
		{"missing url reported at its parent", "upstreams:\n  - name: a\n",
			[]string{"t.yaml:2: upstreams[0].url: required"}},
		{"no upstreams", "listen: :8080\n", []string{"t.yaml: upstreams: at least one upstream is required"}},
		{"duplicate names", "upstreams:\n  - {name: a, url: 'http://h'}\n  - {name: a, url: 'http://h'}\nroutes: [{name: r, upstream: a}]\n",
			[]string{`t.yaml:3: upstreams[1].name: duplicate upstream name "a"`}},
		{"path prefix", "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - {name: r, upstream: a, path_prefix: v1}\n",
			[]string{"t.yaml:3: routes[0].path_prefix: must start with /"}},
		{"failure ratio", "upstreams:\n  - name: a\n    url: http://h\n    breaker:\n      failure_ratio: 1.5\n",
			[]string{"t.yaml:5: upstreams[0].breaker.failure_ratio: must be in (0, 1]"}},
		{"unknown fallback upstream", "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - name: r\n    upstream: a\n    fallbacks:\n      - {upstream: z}\n",
			[]string{`t.yaml:6: routes[0].fallbacks[0].upstream: unknown upstream "z"`}},
		{"failover_on not a 4xx", "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - name: r\n    upstream: a\n    failover_on: [404, 503]\n",
			[]string{"t.yaml:5: routes[0].failover_on[1]: must be a 4xx status other than 429 (got 503)"}},
		{"bad on_timeout", "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - name: r\n    upstream: a\n    retry:\n      on_timeout: panic\n",
			[]string{`t.yaml:6: routes[0].retry.on_timeout: must be failover or retry`}},
		{"a second document", "upstreams: [{name: a, url: 'http://h'}]\n---\nlisten: ':1'\n",
			[]string{"t.yaml:2: a second YAML document (after ---) is not read: one document per file"}},
		{"a second document that does not parse", "upstreams: [{name: a, url: 'http://h'}]\n---\nlisten: [\n",
			[]string{"t.yaml: a second YAML document (after ---) does not parse"}},
		{"apis", "upstreams:\n  - name: a\n    url: http://h\n    apis: [openai, claude]\n",
			[]string{`t.yaml:4: upstreams[0].apis[1]: must be openai or anthropic (got "claude")`}},
		{"apis empty", "upstreams:\n  - name: a\n    url: http://h\n    apis: []\n",
			[]string{`t.yaml:4: upstreams[0].apis: list openai and/or anthropic`}},
		{"api_key_header", "upstreams:\n  - name: a\n    url: http://h\n    api_key_header: bearer\n",
			[]string{`t.yaml:4: upstreams[0].api_key_header: must be x-api-key or authorization (got "bearer")`}},
		{"client limit without rate", "upstreams: [{name: a, url: 'http://h'}]\nclients:\n  - key_header: X-Agent\n",
			[]string{"t.yaml:3: clients[0]: sets no limit: give requests_per_second, tokens_per_minute"}},
		{"spend without prices", "upstreams: [{name: a, url: 'http://h'}]\nclients:\n  - spend: {usd: 5}\n",
			[]string{"t.yaml:3: clients[0].spend: needs prices:"}},
		{"spend of a week", "upstreams: [{name: a, url: 'http://h'}]\nprices: {\"*\": {input: 1, output: 2}}\nclients:\n  - spend: {usd: 5, period: week}\n",
			[]string{"clients[0].spend.period: must be day or month"}},
		{"negative token budget", "upstreams: [{name: a, url: 'http://h'}]\nclients:\n  - tokens_per_minute: -5\n",
			[]string{"t.yaml:3: clients[0].tokens_per_minute: must not be negative"}},
		{"negative max_in_flight", "upstreams:\n  - name: a\n    url: http://h\n    max_in_flight: -1\n",
			[]string{"t.yaml:4: upstreams[0].max_in_flight: must not be negative"}},
		{"bad concurrency mode", "upstreams:\n  - name: a\n    url: http://h\n    concurrency: {mode: auto}\n",
			[]string{`t.yaml:4: upstreams[0].concurrency.mode: must be off, fixed or adaptive (got "auto")`}},
		{"concurrency tolerance under 1", "upstreams:\n  - name: a\n    url: http://h\n    concurrency:\n      adaptive: {tolerance: 0.9}\n",
			[]string{"t.yaml:5: upstreams[0].concurrency.adaptive.tolerance: must be at least 1"}},
		{"concurrency min over max", "upstreams:\n  - name: a\n    url: http://h\n    concurrency:\n      max: 4\n      adaptive: {min: 8}\n",
			[]string{"t.yaml:6: upstreams[0].concurrency.adaptive.min: must not be above concurrency.max (4)"}},
		{"two queue timeouts", "upstreams:\n  - name: a\n    url: http://h\n    queue_timeout: 5s\n    concurrency: {queue: {timeout: 2s}}\n",
			[]string{"t.yaml:5: upstreams[0].concurrency.queue.timeout: is queue_timeout under another name"}},
		{"bad priority", "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - name: r\n    upstream: a\n    priority: urgent\n",
			[]string{`t.yaml:5: routes[0].priority: must be interactive or batch (got "urgent")`}},
		{"bad log level", "log: {level: loud}\nupstreams: [{name: a, url: 'http://h'}]\n",
			[]string{`t.yaml:1: log.level: unknown level "loud"`}},
		{"url and endpoints", "upstreams:\n  - name: a\n    url: http://h\n    endpoints: [http://h2]\n",
			[]string{"t.yaml:3: upstreams[0].url: set one of url, endpoints and discover"}},
		{"bad endpoint", "upstreams:\n  - name: a\n    endpoints:\n      - http://h\n      - h2:8000\n",
			[]string{"t.yaml:5: upstreams[0].endpoints[1]: \"h2:8000\" has no scheme: did you mean http://h2:8000?"}},
		{"duplicate endpoint", "upstreams:\n  - name: a\n    endpoints: [http://h, http://h]\n",
			[]string{`t.yaml:3: upstreams[0].endpoints[1]: duplicate endpoint "http://h"`}},
		{"duplicate endpoint but for a slash", "upstreams:\n  - name: a\n    endpoints: [http://h:8000, http://h:8000/]\n",
			[]string{`t.yaml:3: upstreams[0].endpoints[1]: duplicate endpoint "http://h:8000/"`}},
		{"discover without port", "upstreams:\n  - name: a\n    discover: {dns: vllm.svc}\n",
			[]string{`t.yaml:3: upstreams[0].discover.dns: must be host:port (got "vllm.svc")`}},
		{"discover scheme", "upstreams:\n  - name: a\n    discover:\n      dns: vllm.svc:8000\n      scheme: grpc\n",
			[]string{`t.yaml:5: upstreams[0].discover.scheme: must be http or https`}},
		{"bad balance", "upstreams:\n  - name: a\n    url: http://h\n    balance: random\n",
			[]string{`t.yaml:4: upstreams[0].balance: must be least_requests, round_robin or affinity (got "random")`}},
		{"affinity without a key", "upstreams:\n  - name: a\n    endpoints: [http://h]\n    balance: affinity\n",
			[]string{"upstreams[0].affinity: set one of header and prefix"}},
		{"affinity without balance", "upstreams:\n  - name: a\n    endpoints: [http://h]\n    affinity: {prefix: 2048}\n",
			[]string{"t.yaml:4: upstreams[0].affinity: applies only with balance: affinity"}},
		{"health check path", "upstreams:\n  - name: a\n    url: http://h\n    health_check: {path: health}\n",
			[]string{"upstreams[0].health_check.path: required, starting with /"}},
		{"health check zero", "upstreams:\n  - name: a\n    url: http://h\n    health_check:\n      path: /health\n      unhealthy: 0\n",
			[]string{"t.yaml:6: upstreams[0].health_check.unhealthy: must be at least 1"}},
		{"max_ejected above all", "upstreams:\n  - name: a\n    url: http://h\n    max_ejected: 150%\n",
			[]string{"t.yaml:4: upstreams[0].max_ejected: must be in (0%, 100%]"}},
		{"max_ejected not a share", "upstreams:\n  - name: a\n    url: http://h\n    max_ejected: half\n",
			[]string{`t.yaml:4: upstreams[0].max_ejected: invalid share "half"`}},
		{"syntax error", "upstreams:\n  - name: a\n   url: x\n", []string{"t.yaml:2: upstreams[0].name: did not find expected"}},
		{"syntax error in a flow mapping", "upstreams:\n  - name: a\n    url: http://h\n    timeouts: {connect: 1s\nroutes: []\n",
			[]string{"t.yaml:4: upstreams[0].timeouts: did not find expected ',' or '}'"}},
		{"syntax error, an unterminated string", "upstreams:\n  - name: a\n    url: \"http://h\n",
			[]string{"t.yaml:3: upstreams[0].url: found unexpected end of stream"}},
		{"syntax error, a misindented key", "upstreams:\n  - name: a\n    url: http://h\nserver:\n  read_timeout: 1s\n idle_timeout: 2s\n",
			[]string{"t.yaml:6: server.idle_timeout: did not find expected key"}},
		{"syntax error in a flow list", "upstreams:\n  - name: a\n    url: http://h\n    tags: [a, }\n",
			[]string{"t.yaml:4: upstreams[0].tags: did not find expected node content"}},
		{"syntax error under a secret key, yaml's words kept", "upstreams:\n  - name: a\n    url: http://h\n    headers: {X-A: b\n",
			[]string{"t.yaml:4: upstreams[0].headers: did not find expected ',' or '}'"}},
		{"a key written twice", "listen: :8080\nupstreams: [{name: a, url: 'http://h'}]\nlisten: :8081\n",
			[]string{"t.yaml:3: listen: written twice (first at line 1): keep one"}},
		{"a nested key written twice", "upstreams:\n  - name: a\n    url: http://h\n    timeouts: {connect: 1s, connect: 2s}\n",
			[]string{"t.yaml:4: upstreams[0].timeouts.connect: written twice (first at line 4)"}},
		{"two routes matching the same", "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - {name: r1, upstream: a, model: 'gpt-*'}\n  - {name: r2, upstream: a, path_prefix: /, model: 'gpt-*'}\n",
			[]string{`t.yaml:4: routes[1].path_prefix: matches what routes[0] (r1) matches, the same path_prefix "/" and model "gpt-*"`}},
		{"tracing keys", "upstreams: [{name: a, url: 'http://h'}]\ntracing:\n  endpoint: 127.0.0.1:4318\n  protocol: http/json\n  sample_ratio: 1.5\n",
			[]string{"t.yaml:3: tracing.endpoint: no scheme: write it as http://host:port", "t.yaml:4: tracing.protocol: must be http/protobuf or grpc",
				"t.yaml:5: tracing.sample_ratio: must be a ratio from 0 to 1 (got 1.5)"}},
		{"tracing unknown key", "upstreams: [{name: a, url: 'http://h'}]\ntracing: {endpoint: 'http://c:4318', sampler: on}\n",
			[]string{"t.yaml:2: tracing.sampler: unknown key"}},
		{"several problems at once", "listen: :1\nbogus: 1\nupstreams:\n  - name: a\n    url: http://h\n    timeouts: {connect: soon}\n",
			[]string{"t.yaml:2: bogus: unknown key", `t.yaml:6: upstreams[0].timeouts.connect: invalid duration "soon"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tt.yaml))
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want *config.Error", err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) < len(tt.want) {
				t.Fatalf("got %d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for i, w := range tt.want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, lines[i], w)
				}
			}
		})
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	c, err := Load("../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Upstreams) == 0 || len(c.Routes) == 0 {
		t.Fatal("example config has no upstreams or routes")
	}
}

func TestProblemsNeverQuoteASecret(t *testing.T) {
	for _, doc := range []string{
		"upstreams: [{name: a, url: 'http://h', api_key: [sk-proj-abcdefghijklmnop]}]\n",
		"upstreams: [{name: a, url: 'http://h', timeouts: {connect: sk-proj-abcdefghijkl}}]\n",
		"upstreams: [{name: a, url: 'http://user:hunter2-secret@h'}]\n",
		"upstreams: [{name: a, url: 'ftp://h?key=sk-proj-abcdefghijk'}]\n",
		"upstreams: [{name: a, url: 'ftp://h?api_key=hunter2secret&x=1'}]\n",
		"upstreams: [{name: a, url: 'http://h'}]\nauth: {keys: [short-secret]}\n",
		"upstreams: [{name: a, url: 'http://h'}]\nauth: {keys: {k: 'Bearer hunter2-secret'}}\n",
		"upstreams:\n  - name: a\n    url: http://h\n    api_key: !!float hunter2pass\n", // yaml's message names no key
	} {
		_, err := Parse("t.yaml", []byte(doc))
		if err == nil {
			t.Fatalf("accepted %q", doc)
		}
		msg := err.Error()
		for _, secret := range []string{"abcdefgh", "hunter2", "short-secret"} {
			if strings.Contains(msg, secret) {
				t.Errorf("%q: the message quotes a secret: %s", doc, msg)
			}
		}
	}
}

func TestPoolKeys(t *testing.T) {
	t.Setenv("STURDY_TEST_GPU_B", "gpu-b")
	c, err := Parse("t.yaml", []byte(`upstreams:
  - name: vllm
    endpoints: [http://gpu-a:8000, "http://${STURDY_TEST_GPU_B}:8000"]
    balance: affinity
    affinity: {prefix: 2048}
    health_check: {path: /health, every: 5s, timeout: 1s, healthy: 2, unhealthy: 3}
    slow_start: 0s
    max_ejected: 25%
    ride_through: 10s
  - name: pods
    discover: {dns: "vllm-headless.default.svc.cluster.local:8000", scheme: https, every: 10s}
    max_ejected: 0.75
routes: [{name: r, upstream: vllm}]
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.Upstreams[0], c.Upstreams[1]
	if len(a.Endpoints) != 2 || a.Endpoints[1] != "http://gpu-b:8000" || a.Balance != upstream.BalanceAffinity || a.Affinity.Prefix != 2048 || a.HealthCheck.Unhealthy != 3 ||
		a.SlowStart == nil || *a.SlowStart != 0 || a.MaxEjected != 0.25 || a.RideThrough != 10*time.Second {
		t.Errorf("endpoints upstream: %+v", a)
	}
	if b.Discover.Scheme != "https" || b.Discover.DNS != "vllm-headless.default.svc.cluster.local:8000" || b.MaxEjected != 0.75 ||
		b.SlowStart != nil {
		t.Errorf("discover upstream: %+v", b)
	}
}

func TestWarningsNameAURLEndingInV1(t *testing.T) {
	c, err := Parse("t.yaml", []byte("upstreams:\n  - name: a\n    url: http://h:8000/v1\n  - name: b\n    endpoints: [http://g:1, http://g:2/v1/]\n  - name: c\n    url: http://h:8000/v1beta\nroutes: [{name: r, upstream: a}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ws := c.Warnings()
	if len(ws) != 2 || ws[0].Key != "upstreams[0].url" || ws[0].Line != 3 || !strings.Contains(ws[0].Msg, "did you mean http://h:8000?") ||
		ws[1].Key != "upstreams[1].endpoints[1]" || !strings.Contains(ws[1].Msg, "http://g:2/v1/v1/chat/completions") {
		t.Fatalf("warnings %+v", ws)
	}
}

// TestLoopsNameTheUpstreamAtTheListenAddress: an upstream url or
// endpoint that is Sturdy's own listener is a problem with key and line;
// the same port elsewhere is not.
func TestLoopsNameTheUpstreamAtTheListenAddress(t *testing.T) {
	for doc, want := range map[string]string{
		"listen: :8080\nupstreams:\n  - name: a\n    url: http://127.0.0.1:8080\n":                                        `4 upstreams[0].url "http://127.0.0.1:8080" is Sturdy's own listen address (:8080)`,
		"listen: 127.0.0.1:9000\nupstreams:\n  - name: a\n    endpoints: [http://10.0.0.1:9000, http://localhost:9000]\n": `4 upstreams[0].endpoints[1] "http://localhost:9000" is Sturdy's own listen address`,
	} {
		c, err := Parse("t.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		ps := c.Loops()
		if len(ps) != 1 || !strings.HasPrefix(fmt.Sprintf("%d %s %s", ps[0].Line, ps[0].Key, ps[0].Msg), want) {
			t.Errorf("%q: %+v, want %q", doc, ps, want)
		}
	}
}

// TestAnUpstreamElsewhereOnTheListenPortIsNoLoop: the same port on
// another host, or a loopback address the listener does not bind, is not
// Sturdy itself.
func TestAnUpstreamElsewhereOnTheListenPortIsNoLoop(t *testing.T) {
	for _, doc := range []string{
		"listen: :8080\nupstreams: [{name: a, url: 'http://model-server:8080'}]\n",
		"listen: 127.0.0.1:8080\nupstreams: [{name: a, url: 'http://127.0.0.2:8080'}]\n",
		"listen: 10.1.2.3:8080\nupstreams: [{name: a, url: 'http://127.0.0.1:8080'}]\n",
		"listen: :8080\nupstreams: [{name: a, url: 'http://127.0.0.1:8081'}]\n",
	} {
		if c, err := Parse("t.yaml", []byte(doc)); err != nil || len(c.Loops()) != 0 {
			t.Errorf("%q: %v %v", doc, err, c.Loops())
		}
	}
}

// TestTheAdminSection: admin.listen and its alias admin_listen (not
// both), pprof, and a token from the file or a file of its own.
func TestTheAdminSection(t *testing.T) {
	dir := t.TempDir()
	tokenFile := dir + "/token"
	if err := os.WriteFile(tokenFile, []byte("file-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const up = "upstreams: [{name: a, url: 'http://h'}]\n"
	c, err := Parse("t.yaml", []byte("admin: {listen: '127.0.0.1:9191', pprof: true, token_file: "+tokenFile+"}\n"+up))
	if err != nil || c.AdminListen != "127.0.0.1:9191" || !c.Admin.Pprof || c.Admin.Token != "file-token-0123456789" ||
		!c.Written("admin_listen") {
		t.Fatalf("%+v %v", c, err)
	}
	if c, err := Parse("t.yaml", []byte("admin_listen: '127.0.0.1:9292'\n"+up)); err != nil || c.AdminListen != "127.0.0.1:9292" || c.Admin.Pprof {
		t.Fatalf("the alias: %+v %v", c, err)
	}
	for doc, want := range map[string]string{
		"admin_listen: ':1'\nadmin: {listen: ':2'}\n" + up:                              "t.yaml:2: admin.listen: set admin.listen or the top-level admin_listen",
		"admin: {token: short}\n" + up:                                                  "t.yaml:1: admin.token: too short",
		"admin: {token: 'a-long-enough-token-1', token_file: " + tokenFile + "}\n" + up: "admin.token_file: set token or token_file, not both",
		"admin: {listen: nope}\n" + up:                                                  `t.yaml:1: admin.listen: invalid address "nope"`,
	} {
		if _, err := Parse("t.yaml", []byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", doc, err, want)
		}
	}
}

// TestAWarningNamesAMaxTotalThatLeavesNoAttemptForAFallback.
func TestAWarningNamesAMaxTotalThatLeavesNoAttemptForAFallback(t *testing.T) {
	const up = "upstreams: [{name: a, url: 'http://h'}, {name: b, url: 'http://k'}]\n"
	for doc, warned := range map[string]bool{
		up + "routes:\n  - name: r\n    upstream: a\n    fallbacks: [{upstream: b}]\n    retry: {max_total_attempts: 4}\n":                  true,
		up + "routes:\n  - name: r\n    upstream: a\n    fallbacks: [{upstream: b}]\n    retry: {max_attempts: 2, max_total_attempts: 3}\n": false,
		up + "routes:\n  - name: r\n    upstream: a\n    fallbacks: [{upstream: b}]\n":                                                      false,
		up + "routes:\n  - name: r\n    upstream: a\n    retry: {max_total_attempts: 1}\n":                                                  false,
	} {
		c, err := Parse("t.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		ws := c.Warnings()
		if got := len(ws) == 1 && ws[0].Key == "routes[0].retry.max_total_attempts" && ws[0].Line == 6; got != warned {
			t.Errorf("%q: warnings %+v, want one: %v", doc, ws, warned)
		}
	}
}

// TestAKeyWrittenTwiceIsOneProblem: yaml stops decoding at a duplicated
// key, which used to report what was never missing ("at least one
// upstream is required") beside it.
func TestAKeyWrittenTwiceIsOneProblem(t *testing.T) {
	for _, doc := range []string{
		"listen: :8080\nupstreams:\n  - name: a\n    url: http://h\nlisten: :8081\n",
		"upstreams:\n  - name: a\n    url: http://h\n    url: http://h2\nserver: {read_timeout: 5s}\n",
	} {
		_, err := Parse("t.yaml", []byte(doc))
		var ce *Error
		if !errors.As(err, &ce) || len(ce.Problems) != 1 || !strings.Contains(ce.Problems[0].Msg, "written twice") {
			t.Errorf("%q: %v, want one problem: written twice", doc, err)
		}
	}
	// A document marker before or after the one document is fine.
	for _, doc := range []string{"---\nupstreams: [{name: a, url: 'http://h'}]\n", "upstreams: [{name: a, url: 'http://h'}]\n---\n",
		"upstreams: [{name: a, url: 'http://h'}]\n...\n"} {
		if _, err := Parse("t.yaml", []byte(doc)); err != nil {
			t.Errorf("%q: %v", doc, err)
		}
	}
	// Routes that differ in path_prefix or model are not the same match.
	ok := "upstreams: [{name: a, url: 'http://h'}]\nroutes:\n  - {name: r1, upstream: a}\n  - {name: r2, upstream: a, model: 'gpt-*'}\n  - {name: r3, upstream: a, path_prefix: /v1}\n"
	if _, err := Parse("t.yaml", []byte(ok)); err != nil {
		t.Fatal(err)
	}
}

// TestAWarningNamesARouteNoTargetServes: a route whose path_prefix is one
// API's, none of whose targets declares it in apis, is warned of.
func TestAWarningNamesARouteNoTargetServes(t *testing.T) {
	c, err := Parse("t.yaml", []byte("upstreams:\n  - {name: a, url: 'http://h', apis: [openai]}\n  - {name: b, url: 'http://h2'}\n"+
		"routes:\n  - {name: c, path_prefix: /v1/messages, upstream: a}\n  - {name: d, path_prefix: /v1/messages, model: 'x*', upstream: a, fallbacks: [{upstream: b}]}\n  - {name: e, path_prefix: /, upstream: a}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ws := c.Warnings()
	if len(ws) != 1 || ws[0].Key != "routes[0].path_prefix" || ws[0].Line != 5 || !strings.Contains(ws[0].Msg, "serves anthropic") {
		t.Fatalf("warnings %+v", ws)
	}
}

// TestLineIsWhereTheFileSetsAKey: Line gives a key's line for a problem
// found past Validate (a build without tracing refusing tracing.endpoint),
// 0 for a key left to its default.
func TestLineIsWhereTheFileSetsAKey(t *testing.T) {
	t.Parallel()
	c, err := Parse("t.yaml", []byte("upstreams: [{name: a, url: 'http://h'}]\n\ntracing:\n  endpoint: http://c:4318\n"))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int{"tracing.endpoint": 4, "tracing": 3, "upstreams": 1, "tracing.protocol": 0} {
		if got := c.Line(key); got != want {
			t.Errorf("Line(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestSecretFilesAreBoundedAndRegular: a secret file (api_key_file,
// admin.token_file, shared_state.password_file, auth.keys_file) over its
// bound, or not a regular file, is refused with its key and line, at
// once. Before, /dev/zero was read to 1.15 GB in 3 s and a FIFO hung
// -check.
func TestSecretFilesAreBoundedAndRegular(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("k"), MaxSecretFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	up := "upstreams: [{name: a, url: 'http://h'}]\n"
	for _, tt := range []struct{ doc, want string }{
		{"upstreams: [{name: a, url: 'http://h', api_key_file: /dev/zero}]\n", "t.yaml:1: upstreams[0].api_key_file: \"[redacted]\" is not a regular file but a device"},
		{"upstreams: [{name: a, url: 'http://h', api_key_file: " + big + "}]\n", "upstreams[0].api_key_file: \"[redacted]\" is over 64 KiB"},
		{"admin: {token_file: " + fifo + "}\n" + up, "t.yaml:1: admin.token_file: \"" + fifo + "\" is not a regular file but a named pipe"},
		{"auth: {keys_file: /dev/zero}\n" + up, "t.yaml:1: auth.keys_file: \"[redacted]\" is not a regular file but a device"},
		{"shared_state: {redis_url: 'redis://127.0.0.1:6379', password_file: " + dir + "}\n" + up, "shared_state.password_file: \"" + dir + "\" is not a regular file but a directory"},
	} {
		done := make(chan error, 1)
		go func() { _, err := Parse("t.yaml", []byte(tt.doc)); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%q: %v, want %q", tt.doc, err, tt.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%q: not refused within 5 s", tt.doc)
		}
	}
}

// TestAnUnsetVariableIsWarnedOf: a ${VAR} unset or empty is a warning
// naming its key, line and what the empty value does — never a value.
// Before, api_key: ${OPENAI_API_KEY} unset was accepted silently, and
// the provider answered each client's dummy key 401.
func TestAnUnsetVariableIsWarnedOf(t *testing.T) {
	t.Setenv("STURDY_TEST_EMPTY", "")
	t.Setenv("STURDY_TEST_SET", "sk-a-value-never-shown")
	doc := "upstreams:\n  - name: a\n    url: 'http://h'\n    api_key: ${STURDY_TEST_UNSET_XYZ}\n" +
		"  - name: b\n    url: 'http://h2'\n    api_key: ${STURDY_TEST_SET}\nadmin: {token: '${STURDY_TEST_EMPTY}'}\nroutes: [{name: r, upstream: a}]\n"
	c, err := Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range c.Warnings() {
		got = append(got, fmt.Sprintf("%d %s: %s", w.Line, w.Key, w.Msg))
	}
	all := strings.Join(got, "\n")
	if !strings.Contains(all, "4 upstreams[0].api_key: ${STURDY_TEST_UNSET_XYZ} is unset") || !strings.Contains(all, "client's own credential goes upstream") ||
		!strings.Contains(all, "admin.token: ${STURDY_TEST_EMPTY} is empty") || strings.Contains(all, "STURDY_TEST_SET") || strings.Contains(all, "never-shown") {
		t.Fatalf("warnings:\n%s", all)
	}
	// With auth.keys on, the clients' credentials are Sturdy's: none goes upstream, and the warning says so.
	c, err = Parse("t.yaml", []byte(doc+"auth: {keys: [client-key-0123456789]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w := fmt.Sprint(c.Warnings()); !strings.Contains(w, "upstreams[0].api_key") || !strings.Contains(w, "no client's credential goes upstream") {
		t.Fatalf("warnings with auth.keys on: %s", w)
	}
}
