// Package config is Sturdy's YAML schema: types, defaults, loading with
// strict decoding, and validation whose every message names the key and
// the line.
//
//   - config.go: the schema — every key's type, its default and its bound
//     in its field's comment; an upstream's is package upstream's Options
//     and a route's package proxy's Route (Upstream and Route are those
//     types: one shape, decoded here, compiled there), the units a value
//     is written in are package units'.
//   - load.go: reading a file (Load, Parse): strict YAML decoding with each
//     key's line (schemaProblems: unknown keys, time.Duration values), ${VAR} expansion, *_file secrets read, the implicit
//     route, the one-upstream default (Default), secrets kept out of every
//     message, and WriteProblems, which prints each problem with its key
//     and line.
//   - clientkeys.go: client_keys_file, read with the config (ParseClientKeys:
//     its own keys and lines, bounded in size and count, a key only as
//     ${VAR} or its SHA-256).
//   - validate.go: the checks a parsed config must pass (Validate: each
//     problem named by key and line; the caller exits 2), and Warnings:
//     what is valid but most likely not meant, which -check and startup
//     print without stopping.
//
// Config decides nothing at run time: main turns a Config into the proxy's
// options (its upstreams and routes as they are) and reloads it.
package config

import (
	"fmt"
	"net/netip"

	"sturdy/proxy"
	"sturdy/units"
	"sturdy/upstream"
)

// Config is the whole configuration file. The defaults its comments name
// are filled in by the package that uses each value (proxy, policy,
// breaker); a key left out of the file stays zero here.
//
// Each key's field comment is its reference (tools/configref generates
// docs/configuration.md from it): what the key means, then "Default X."
// or "Required.", and "Needs a restart." where a reload does not apply it.
type Config struct {
	// Listen is the client-facing address. STURDY_LISTEN and -listen
	// override it. Default `:8080`. Needs a restart.
	Listen string `yaml:"listen"`
	// AdminListen is the admin listener's address, the alias of
	// admin.listen (set one). Default `127.0.0.1:9090`. Needs a restart.
	AdminListen string `yaml:"admin_listen"`
	// Admin is the admin listener: metrics, health, upstream state and
	// opt-in pprof.
	Admin Admin `yaml:"admin"`
	// Log is Sturdy's log output. Needs a restart.
	Log Log `yaml:"log"`
	// Upstreams are the model servers Sturdy forwards to. At least one.
	// Required.
	Upstreams []Upstream `yaml:"upstreams"`
	// Routes send requests to upstreams by path and model. Needed with
	// several upstreams. Default: with one upstream, one route "default"
	// sending every path to it.
	Routes []Route `yaml:"routes"`
	// Clients are per-client limits, each keyed by a header's value
	// (hashed, never stored); every request must pass all of them.
	// Default none.
	Clients []ClientLimit `yaml:"clients"`
	// ClientKeysFile names a YAML file of single client keys' settings,
	// read with the config; a change to it reloads like one to the
	// config. The file is keys: [{sha256 or key: ${VAR}, name, priority,
	// requests_per_second, burst, token budgets, spend}], at most 16 MiB
	// and 100,000 keys. A relative path is the working directory's.
	// Default none.
	ClientKeysFile string `yaml:"client_keys_file"`
	// ClientKeys are the keys ClientKeysFile lists, once read.
	ClientKeys []ClientKey `yaml:"-"`
	// Prices are what models cost, USD per million tokens, by model glob
	// (the model as sent; the most literal glob wins): what spend budgets
	// and sturdy_spend_usd_total count. A model no glob prices costs 0.
	// At most 256 globs. Default none.
	Prices map[string]Price `yaml:"prices"`
	// Server bounds how clients may use the listener. Its keys need a
	// restart, except those marked hot-reloading.
	Server Server `yaml:"server"`
	// TLS serves the listener over HTTPS when cert_file and key_file are
	// set (both or neither). Default off. Needs a restart.
	TLS ListenerTLS `yaml:"tls"`
	// Auth, when it has keys, requires every client to present one as
	// "Authorization: Bearer <key>"; missing or wrong gets 401. With auth
	// on, the client's Authorization never goes upstream. Default off.
	Auth Auth `yaml:"auth"`
	// SharedState shares cooldowns, limits, token budgets and breaker
	// hints with the other replicas of a fleet through Redis; without it
	// each replica learns and paces alone. Default none.
	SharedState *SharedState `yaml:"shared_state"`
	// Tracing exports OpenTelemetry traces of every request over OTLP;
	// the standard OTEL_* variables fill each key left out. Default off.
	Tracing Tracing `yaml:"tracing"`

	// written holds the keys the file set (dotted paths → line), so a
	// written zero is told from a key left out.
	written map[string]int
	// unsetVars are the keys whose ${VAR} was unset or empty as the file
	// was read (Warnings).
	unsetVars []Problem
}

// Admin is the admin listener: where, whether pprof is served, and the
// token its endpoints (all but /healthz and /readyz) need.
type Admin struct {
	// Listen is the admin listener's address; the top-level admin_listen
	// is its alias (set one). Loopback by default, never the public port;
	// STURDY_DEFAULT_ADMIN_LISTEN changes the default (the image's is
	// :9090). STURDY_ADMIN_LISTEN and -admin-listen override it. Default
	// `127.0.0.1:9090`. Needs a restart.
	Listen string `yaml:"listen"`
	// Pprof serves Go's profiler under /debug/pprof/ (a profile's
	// seconds at most 60). Default false. Hot-reloads.
	Pprof bool `yaml:"pprof"`
	// Token is the bearer token /metrics and /debug/* require, as
	// "Authorization: Bearer <token>"; /healthz, /readyz and the status
	// page stay open. At least 16 characters; ${VAR} is expanded. Default
	// none. Hot-reloads.
	Token string `yaml:"token"`
	// TokenFile names a file holding the token, in place of token (not
	// both). Default none. Hot-reloads.
	TokenFile string `yaml:"token_file"`
}

// SharedState is how a fleet of Sturdys shares state through Redis.
type SharedState struct {
	// RedisURL is the Redis server: redis:// or rediss://, with the
	// database. ${VAR} is expanded. Required.
	RedisURL string `yaml:"redis_url"`
	// MasterName is the Sentinel master's name; with
	// sentinel_addresses, the master is found through Sentinel. Default
	// none.
	MasterName string `yaml:"master_name"`
	// SentinelAddresses are the Sentinels (host:port) asked for
	// master_name's address. Default none.
	SentinelAddresses []string `yaml:"sentinel_addresses"`
	// Password overrides the URL's password. ${VAR} is expanded. Default
	// none: the URL's.
	Password string `yaml:"password"`
	// PasswordFile names a file holding the password, in place of
	// password. Default none.
	PasswordFile string `yaml:"password_file"`
	// KeyPrefix starts every Redis key and the events channel. Default
	// `sturdy:`.
	KeyPrefix string `yaml:"key_prefix"`
	// HashKey, when set, keys credentials in Redis by HMAC-SHA-256 with
	// it, else by SHA-256; Redis holds hashes only either way. ${VAR} is
	// expanded. Default none.
	HashKey string `yaml:"hash_key"`
	// Timeout is the longest a request waits on Redis. Default 50ms.
	Timeout Duration `yaml:"timeout"`
	// OnFailure is what a request does when Redis is slow or down: local
	// carries on with this replica's own state, refuse answers 503
	// shared_state_unavailable. Default local.
	OnFailure string `yaml:"on_failure"`
	// ShareBreakers announces an endpoint's breaker opening to the
	// fleet: the others leave the endpoint out until this replica's
	// probe. Default false.
	ShareBreakers bool `yaml:"share_breakers"`
}

// Tracing is where and how Sturdy exports traces. Every key left out is
// filled from the OTEL_* environment (the file's keys win over it).
type Tracing struct {
	// Endpoint is the OTLP collector's base URL; setting it turns
	// tracing on. For http/protobuf /v1/traces is appended; grpc is
	// usually :4317. ${VAR} is expanded. Default:
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
	// else off.
	Endpoint string `yaml:"endpoint"`
	// Protocol is the export protocol: http/protobuf or grpc. Default:
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL,
	// else `http/protobuf`.
	Protocol string `yaml:"protocol"`
	// SampleRatio is the share of traces started here that are sampled; a
	// sampled incoming traceparent is always followed. Default:
	// OTEL_TRACES_SAMPLER, else `1`.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// ServiceName is the traces' service.name. Default:
	// OTEL_SERVICE_NAME, else `sturdy`.
	ServiceName string `yaml:"service_name"`
	// Headers are sent with every export; their values are secrets, never
	// logged. ${VAR} is expanded in the values. Default:
	// OTEL_EXPORTER_OTLP_HEADERS, else none.
	Headers map[string]string `yaml:"headers"`
}

// Server bounds the client-facing listener.
type Server struct {
	// ReadTimeout bounds reading a whole request (headers and body); a
	// client trickling its headers (slowloris) is cut here. Default 60s.
	// Needs a restart.
	ReadTimeout Duration `yaml:"read_timeout"`
	// IdleTimeout bounds a keep-alive connection waiting for its next
	// request. Default 120s. Needs a restart.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes caps the request line and headers; larger gets 431.
	// Default 32KiB. Needs a restart.
	MaxHeaderBytes Size `yaml:"max_header_bytes"`
	// MaxConnections caps open client connections; one more is answered
	// 503 too_many_connections at once. The default leaves 64 descriptors
	// for files and logs, 64 for the admin listener, and half the rest
	// for upstream connections. Default: half the process's file
	// descriptor limit less 128, at least 16, at most 65536. Needs a
	// restart.
	MaxConnections int `yaml:"max_connections"`
	// WriteTimeout is the longest a single write to a client may block: a
	// client that stops reading is cut (a stream it keeps reading never
	// is). Default 60s. Needs a restart.
	WriteTimeout Duration `yaml:"write_timeout"`
	// TrustedProxies are CIDRs (or single addresses) of peers whose
	// X-Forwarded-For/-Host/-Proto are kept (Sturdy appends its peer to
	// X-Forwarded-For); from anyone else they are replaced by what Sturdy
	// saw. Default none. Hot-reloads.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// AllowedHosts are names, beyond localhost and *.localhost, that a
	// request reaching Sturdy on a loopback address may carry as its Host
	// or Origin (a name of one label, or an address, always may): a web
	// page that rebinds its own name to 127.0.0.1 is refused. Default
	// none. Hot-reloads.
	AllowedHosts []string `yaml:"allowed_hosts"`
	// CORSOrigins are the browser origins ("http://localhost:3000", or
	// "*") Sturdy grants cross-origin calls: it answers their preflights
	// and marks their answers. Other preflights are refused, never
	// forwarded. Default none. Hot-reloads.
	CORSOrigins []string `yaml:"cors_origins"`
	// ShutdownGrace is how long, after SIGTERM/SIGINT, requests and
	// streams in flight may take to finish; past it, open streams end with
	// a stream_interrupted event. A second signal ends it at once.
	// Default 30s. Hot-reloads.
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// ShutdownDelay keeps serving, with /readyz already 503, this long
	// after the signal before draining (a sidecar's agent may still be
	// finishing). Default 0s. Hot-reloads.
	ShutdownDelay Duration `yaml:"shutdown_delay"`
	// MaxBufferedBytes bounds the bytes held on behalf of clients, all
	// together: streams' heads held before their commit point and by
	// stream_hold, rescue text, bodies read whole for HTTP/1.0 clients.
	// Past it a hold is released early, a rescue becomes unrescuable and
	// an HTTP/1.0 reply is 502 response_too_large. Default 256MiB.
	// Hot-reloads.
	MaxBufferedBytes Size `yaml:"max_buffered_bytes"`
	// MaxRequestBytes bounds the request bodies held, all requests in
	// flight together (a body is held until its request ends: retries
	// and fallbacks resend it). A request that would pass it gets 503
	// server_busy, before its body is read when it has a Content-Length.
	// Default 512MiB. Hot-reloads.
	MaxRequestBytes Size `yaml:"max_request_bytes"`
	// ReduceMemory releases an idle keep-alive connection's request
	// context and buffers between requests (fasthttp's
	// ReduceMemoryUsage): about half the memory per idle connection, for
	// more CPU per request (docs/limits.md). Default false. Needs a
	// restart.
	ReduceMemory bool `yaml:"reduce_memory"`
	// ReduceMemoryAbove is how many client connections may be open before
	// the next one opened is served as with reduce_memory (for its life):
	// a few busy connections run at full speed, a crowd of idle ones
	// costs half the memory. At max_connections or above, never. Default
	// 1000. Needs a restart.
	ReduceMemoryAbove int `yaml:"reduce_memory_above"`
}

// ParsePrefix reads a trusted_proxies entry: a CIDR, or one address.
func ParsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR (10.0.0.0/8) nor an address", s)
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// RestartOnly returns s without the keys that hot-reload, for telling
// whether a reload changed one that needs a restart.
func (s Server) RestartOnly() Server {
	s.TrustedProxies, s.AllowedHosts, s.CORSOrigins = nil, nil, nil
	s.ShutdownGrace, s.ShutdownDelay = 0, 0
	s.MaxBufferedBytes, s.MaxRequestBytes = 0, 0
	return s
}

// ListenerTLS serves the listener over TLS.
type ListenerTLS struct {
	// CertFile names the listener's PEM certificate chain. Default none.
	// Needs a restart.
	CertFile string `yaml:"cert_file"`
	// KeyFile names the listener's PEM private key. Default none. Needs a
	// restart.
	KeyFile string `yaml:"key_file"`
}

// Auth is client authentication with keys Sturdy issues.
type Auth struct {
	// Keys are the client keys accepted, checked in constant time. At
	// least 16 characters each; ${VAR} is expanded. Default none.
	Keys []string `yaml:"keys"`
	// KeysFile names a file of more client keys, one per line (blank
	// lines and # comments ignored). Default none.
	KeysFile string `yaml:"keys_file"`
}

// ClientLimit rate-limits each client: its one shape is package proxy's
// ClientLimit.
type ClientLimit = proxy.ClientLimit

// TokenLimits are a client's token budgets: package proxy's TokenLimits.
type TokenLimits = proxy.TokenLimits

// Price is a model's price and Spend a client's spend budget: package
// proxy's.
type (
	Price = proxy.Price
	Spend = proxy.Spend
)

// MaxPrices bounds the model globs prices: lists.
const MaxPrices = 256

// Log configures logging.
type Log struct {
	// Level is the least severe level logged: debug, info, warn or
	// error. Default info. Needs a restart.
	Level string `yaml:"level"`
	// Format is the log lines' form: json or console. With json every
	// line Sturdy prints is JSON, fasthttp's own messages included.
	// Default json. Needs a restart.
	Format string `yaml:"format"`
}

// Upstream is one model server, or a pool of its replicas: its one shape
// is package upstream's Options (the yaml keys are its fields'), which
// this package decodes and validates and the proxy compiles.
type Upstream = upstream.Options

// Route sends requests whose path starts with path_prefix to its
// upstream: its one shape is package proxy's Route (the yaml keys are its
// fields'), with its Retry, StreamHold and fallback Target.
type (
	Route      = proxy.Route
	Retry      = proxy.Retry
	StreamHold = proxy.StreamHold
	Target     = proxy.Target
)

// The units a config value is written in (package units).
type (
	Duration = units.Duration
	Percent  = units.Percent
	Size     = units.Size
)
