// Command sturdy is a resilient reverse proxy for OpenAI-compatible model
// servers: point an agent's baseURL at it and it absorbs the upstream's
// passing faults (retries with full jitter, Retry-After, circuit breaker)
// while passing the client's own mistakes back untouched.
//
// main only wires things; the request path is package proxy.
//
//	main.go    flags → load and validate the config (-check) → build the proxy, the admin listener and the
//	           logger → serve → graceful shutdown; the config's translation into proxy.Options
//	reload.go  hot reload: SIGHUP and file changes (settled before they are read), what only a restart applies
//	demo.go    -demo: a fake model server with passing faults behind an embedded config, on loopback
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"sturdy/admin"
	"sturdy/config"
	"sturdy/fleet"
	"sturdy/metrics"
	"sturdy/proxy"
	"sturdy/tracing"
	"sturdy/upstream"
)

// version and commit are stamped at build time:
// -ldflags "-X main.version=1.2.3 -X main.commit=abc123".
var (
	version = "dev"
	commit  = ""
)

// defaultShutdownGrace is how long in-flight requests and streams get to
// finish after SIGINT/SIGTERM (server.shutdown_grace).
const defaultShutdownGrace = 30 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// settings are the command line and environment: what loadConfig needs
// to (re)build the configuration.
type settings struct {
	configPath, upstream, listen, adminListen string
	// demo is set for -demo: the upstream is the embedded fake server.
	demo bool
}

// cli is the command line: the settings and what to do with them.
type cli struct {
	settings
	check, healthcheck, version bool
	fs                          *flag.FlagSet
}

// parseFlags reads args (environment variables give the defaults).
func parseFlags(args []string, stderr io.Writer) (cli, error) {
	var c cli
	fs := flag.NewFlagSet("sturdy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.configPath, "config", os.Getenv("STURDY_CONFIG"), "config file (YAML) [env STURDY_CONFIG]; without it Sturdy forwards everything to -upstream")
	fs.StringVar(&c.upstream, "upstream", os.Getenv("STURDY_UPSTREAM"), "upstream URL [env STURDY_UPSTREAM] (default "+config.DefaultUpstreamURL+"); with a config file, replaces the url of its only upstream")
	fs.StringVar(&c.listen, "listen", os.Getenv("STURDY_LISTEN"), "listen address [env STURDY_LISTEN], overriding the config's (default :8080)")
	fs.StringVar(&c.adminListen, "admin-listen", os.Getenv("STURDY_ADMIN_LISTEN"), "admin listener address [env STURDY_ADMIN_LISTEN], overriding the config's (default "+config.DefaultAdminListen+")")
	fs.BoolVar(&c.check, "check", false, "validate the config, print what is wrong, exit 0 (valid) or 2 (invalid)")
	fs.BoolVar(&c.healthcheck, "healthcheck", false, "exit 0 when /healthz on the admin listener answers (for container health checks); without -config or -admin-listen it probes the admin listener of the Sturdy that is PID 1 (a container's), flags included")
	fs.BoolVar(&c.version, "version", false, "print version, commit and Go version")
	fs.BoolVar(&c.demo, "demo", false, "run in front of an embedded fake model server with a mild fault profile (no model needed)")
	fs.Usage = func() {} // -h is answered by run, on stdout; a bad flag gets one hint
	c.fs = fs
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		// Flags stop at the first argument that is not one: `sturdy x.yaml
		// -check` would otherwise serve the embedded default, -check unseen.
		return c, fmt.Errorf("sturdy: unexpected argument %q: Sturdy takes flags only (a config file is -config FILE): %w", fs.Arg(0), errPositional)
	}
	return c, nil
}

// errPositional is parseFlags' error for an argument that is not a flag
// (the flag package has printed its own errors already).
var errPositional = errors.New("no positional arguments")

func run(args []string, stdout, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage(c.fs, stdout)
		return 0
	case err != nil:
		if errors.Is(err, errPositional) {
			fmt.Fprintln(stderr, err)
		}
		fmt.Fprintln(stderr, "sturdy -h lists the flags")
		return 2
	}
	s := c.settings
	if c.healthcheck {
		return probeHealth(adminAddr(servingSettings(c, "/proc")), stderr)
	}
	if c.version {
		build := ""
		if !tracing.Exporters {
			build = ", without tracing" // built with -tags sturdy_notracing
		}
		fmt.Fprintf(stdout, "sturdy %s (commit %s, %s%s)\n", version, commitID(), runtime.Version(), build)
		return 0
	}
	if s.demo {
		fake, err := startDemoUpstream()
		if err != nil {
			fmt.Fprintln(stderr, "demo:", err)
			return 2
		}
		defer fake.Close()
		s.upstream, s.configPath = fake.URL, ""
	}
	cfg, err := loadConfig(s)
	if err != nil {
		config.WriteProblems(stderr, err)
		return 2
	}
	if s.demo {
		demoConfig(cfg)
	}
	switch {
	case c.check:
		for _, w := range cfg.Warnings() {
			fmt.Fprintln(stdout, "warning:", describeProblem(s, w))
		}
		if t := tracingOptions(cfg.Tracing); t != nil {
			fmt.Fprintf(stdout, "tracing on: %s to %s, sample ratio %g, service %s\n", t.Protocol, t.URL, t.SampleRatio, t.ServiceName)
		}
		fmt.Fprintln(stdout, "config OK")
		return 0
	}
	return serve(s, cfg, stderr)
}

// usage is -h's answer: what Sturdy is in a line, then the flag table.
func usage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintln(w, "sturdy: a resilient reverse proxy for OpenAI-compatible model servers (retries, breakers, fallbacks).")
	fmt.Fprintln(w, "Usage: sturdy [flags]   (no config: forwards everything to -upstream, default "+config.DefaultUpstreamURL+")")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// servingSettings are the settings -healthcheck probes with: its own, or,
// when it was given neither -config nor -admin-listen and PID 1 is this same
// program (a container's Sturdy, whose HEALTHCHECK cannot repeat the flags
// it was started with), those of PID 1's command line.
func servingSettings(c cli, proc string) settings {
	own := false
	c.fs.Visit(func(f *flag.Flag) { own = own || f.Name == "config" || f.Name == "admin-listen" })
	if own {
		return c.settings
	}
	b, err := os.ReadFile(filepath.Join(proc, "1", "cmdline"))
	if err != nil || len(b) == 0 {
		return c.settings
	}
	argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	if !sameProgram(filepath.Join(proc, "1", "exe"), argv[0]) {
		return c.settings
	}
	served, err := parseFlags(argv[1:], io.Discard)
	if err != nil || served.healthcheck {
		return c.settings
	}
	return served.settings
}

// adminAddr is the admin address -healthcheck probes: as adminListen
// decides it, with the file's address read for that key alone
// (config.AdminListenOf) — a file edited into something invalid, which the
// serving Sturdy refused to reload, must not make it unhealthy.
func adminAddr(s settings) string {
	var file string
	if b, err := os.ReadFile(s.configPath); s.configPath != "" && err == nil {
		file = config.AdminListenOf(b)
	}
	return adminListen(s.adminListen, file)
}

// adminListen is the admin listener's address: the -admin-listen flag's,
// else the one the file writes (file), else the container's default
// (STURDY_DEFAULT_ADMIN_LISTEN), else config's default.
func adminListen(flag, file string) string {
	switch d := os.Getenv("STURDY_DEFAULT_ADMIN_LISTEN"); {
	case flag != "":
		return flag
	case file != "":
		return file
	case d != "":
		return d
	}
	return config.DefaultAdminListen
}

// sameProgram says whether exe (a /proc/<pid>/exe link), or else the
// process's argv[0], is this executable.
func sameProgram(exe, argv0 string) bool {
	self, err := os.Executable()
	if err != nil {
		return false
	}
	if target, err := os.Readlink(exe); err == nil {
		return target == self
	}
	return filepath.Base(argv0) == filepath.Base(self)
}

// serve runs Sturdy until SIGINT/SIGTERM and returns the exit code.
func serve(s settings, cfg *config.Config, stderr io.Writer) int {
	in, err := start(s, cfg, newLogger(cfg.Log, stderr))
	if err != nil {
		return 2 // start logged why
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	return in.run(sig)
}

// instance is a running Sturdy: the proxy and its listener, the admin
// listener, and the reloader watching SIGHUP and the config file.
type instance struct {
	log      zerolog.Logger
	p        *proxy.Proxy
	ln       net.Listener
	adminLn  net.Listener
	adminSrv *http.Server
	// served receives a server's error if one stops on its own.
	served chan error
	hup    chan os.Signal
	// stopWatching ends the reloader; watching closes when it has.
	stopWatching context.CancelFunc
	watching     <-chan struct{}
	reloader     *reloader
}

// start builds the proxy from cfg, binds both listeners, and starts
// serving and reloading (on SIGHUP and when the config file changes). An
// error has been logged.
func start(s settings, cfg *config.Config, logger zerolog.Logger) (*instance, error) {
	m := metrics.New()
	tracing.LogErrors(func(err error, suppressed int) {
		logger.Warn().Err(err).Int("not_logged_since", suppressed).Msg("tracing: spans not exported")
	})
	p, err := proxy.New(proxyOptions(cfg, logger, m))
	if err != nil {
		logger.Error().Err(err).Msg("invalid configuration")
		return nil, err
	}
	in := &instance{log: logger, p: p, served: make(chan error, 2), hup: make(chan os.Signal, 1)}
	if in.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		logger.Error().Err(err).Str("listen", cfg.Listen).Msg("cannot listen; set listen, -listen or STURDY_LISTEN")
		return nil, err
	}
	if in.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		if s.adminListen != "" || cfg.Written("admin_listen") {
			in.ln.Close()
			logger.Error().Err(err).Str("admin_listen", cfg.AdminListen).
				Msg("cannot bind the admin listener; set admin.listen, -admin-listen or STURDY_ADMIN_LISTEN")
			return nil, err
		}
		// The default address is taken (another Sturdy, a Prometheus):
		// the proxy is what the user asked for, so it serves anyway.
		logger.Warn().Str("admin_listen", cfg.AdminListen).Str("error", describeListenError(err)).
			Msg("admin listener off (its default address is taken): no /metrics, /healthz, /readyz; set admin.listen, -admin-listen or STURDY_ADMIN_LISTEN to another address")
		in.adminLn = nil
	}
	in.reloader = &reloader{s: s, p: p, m: m, log: logger, running: cfg}
	in.reloader.current.Store(cfg)
	in.adminSrv = admin.Server(admin.Handler(p, m.Registry, in.reloader.adminSettings),
		log.New(logger.With().Str("component", "admin").Logger(), "", 0))
	startupLine(logger, s, cfg, in)
	for _, w := range cfg.Warnings() {
		logger.Warn().Msg(describeProblem(s, w))
	}
	go warnUnanswered(logger, cfg)
	go func() {
		if cfg.TLS.CertFile != "" {
			in.served <- p.ServeTLS(in.ln, cfg.TLS.CertFile, cfg.TLS.KeyFile)
			return
		}
		in.served <- p.Serve(in.ln)
	}()
	if in.adminLn != nil {
		go func() { in.served <- admin.Serve(in.adminSrv, in.adminLn) }()
	}
	signal.Notify(in.hup, syscall.SIGHUP)
	var ctx context.Context
	ctx, in.stopWatching = context.WithCancel(context.Background())
	in.watching = in.reloader.start(ctx, in.hup)
	return in, nil
}

// startupLine logs what a user needs to know once Sturdy serves: where
// it listens, each upstream and where it points, the routes, the admin
// address — and warns when it listens on every interface without auth.
func startupLine(logger zerolog.Logger, s settings, cfg *config.Config, in *instance) {
	ev := logger.Info().Str("listen", in.ln.Addr().String()).Bool("tls", cfg.TLS.CertFile != "").
		Bool("client_auth", len(cfg.Auth.Keys) > 0)
	if in.adminLn != nil {
		ev = ev.Str("admin_listen", in.adminLn.Addr().String())
	}
	ups := zerolog.Dict()
	for _, u := range cfg.Upstreams {
		switch {
		case u.URL != "":
			ups.Str(u.Name, u.URL)
		case len(u.Endpoints) > 0:
			ups.Str(u.Name, strings.Join(u.Endpoints, ", "))
		default:
			ups.Str(u.Name, "dns "+u.Discover.DNS)
		}
	}
	routes := zerolog.Arr()
	for _, r := range cfg.Routes {
		prefix := r.PathPrefix
		if prefix == "" {
			prefix = "/"
		}
		routes.Str(prefix + " → " + r.Upstream)
	}
	ev.Dict("upstreams", ups).Array("routes", routes).Str("version", version).Msg("sturdy started")
	if s.demo {
		logger.Info().Str("fake_server", s.upstream).Str("faults", demoFaults).
			Str("outage_at", time.Now().Add(demoProfile.Outage.From).Format("15:04:05")).
			Msg("demo mode: Sturdy is in front of an embedded fake model server; its outage comes about a minute in")
		// The command is the message, not a field: a field's quotes are
		// escaped, and a copied command would send backslashes.
		logger.Info().Msg("watch it: " + demoWatch(in.ln.Addr().String()))
	}
	if host, _, err := net.SplitHostPort(cfg.Listen); err == nil && len(cfg.Auth.Keys) == 0 && (host == "" || host == "0.0.0.0" || host == "::") {
		logger.Warn().Str("listen", cfg.Listen).
			Msg("listening on every interface with no client auth: anyone who reaches this port uses your upstreams (set auth.keys, or listen on 127.0.0.1)")
	}
}

// startProbeTimeout bounds warnUnanswered's connect to each endpoint.
const startProbeTimeout = 2 * time.Second

// warnUnanswered connects once to each endpoint a config names (discovered
// ones aside) and logs one warning for each that does not answer: at
// start that is most often no model server running at all. It runs
// beside serving, never delaying it.
func warnUnanswered(logger zerolog.Logger, cfg *config.Config) {
	for _, u := range cfg.Upstreams {
		urls := u.Endpoints
		if u.URL != "" {
			urls = []string{u.URL}
		}
		for _, raw := range urls {
			target, err := url.Parse(raw)
			if err != nil || target.Host == "" {
				continue
			}
			host, port := upstream.SplitHostPort(target.Host, target.Scheme)
			c, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), startProbeTimeout)
			if err == nil {
				c.Close()
				continue
			}
			logger.Warn().Str("upstream", u.Name).Str("url", target.Scheme+"://"+target.Host).Str("error", proxy.WhyUnreachable(err)).
				Msg("the upstream does not answer at start; requests to it fail until it does (no model server? try -demo)")
		}
	}
}

// demoWatch is a curl loop that shows the demo's requests as they go, one
// status a second: the outage a minute in shows as Sturdy's 503s and then
// its recovery.
func demoWatch(listen string) string {
	_, port, _ := net.SplitHostPort(listen)
	return "while sleep 1; do curl -s -o /dev/null -w '%{http_code} ' localhost:" + port +
		"/v1/chat/completions -d '{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'; done"
}

// describeProblem is a config warning as "file:line: key: message".
func describeProblem(s settings, p config.Problem) string {
	where := s.configPath
	if where == "" {
		where = "-upstream"
	}
	if p.Line > 0 {
		where += ":" + strconv.Itoa(p.Line)
	}
	return where + ": " + p.Key + ": " + p.Msg
}

// describeListenError names why a listener could not bind, in a few words.
func describeListenError(err error) string {
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return "address already in use"
	case errors.Is(err, syscall.EACCES):
		return "permission denied"
	}
	return err.Error()
}

// run serves until a signal arrives on stop (or a server fails), then
// shuts down; it returns the exit code.
func (in *instance) run(stop <-chan os.Signal) int {
	select {
	case err := <-in.served:
		in.log.Error().Err(err).Msg("server stopped")
		in.shutdown(time.Second)
		return 1
	case s := <-stop:
		in.log.Info().Str("signal", s.String()).Msg("shutting down")
	}
	srv := in.reloader.current.Load().Server
	in.p.Drain()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // a second signal ends the drain at once
		select {
		case s := <-stop:
			in.log.Warn().Str("signal", s.String()).Msg("second signal: ending the drain now")
			cancel()
		case <-ctx.Done():
		}
	}()
	if d := srv.ShutdownDelay.Std(); d > 0 {
		in.log.Info().Dur("shutdown_delay", d).Msg("draining: /readyz answers 503, requests are still served until the delay ends")
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	grace := srv.ShutdownGrace.Std()
	if grace <= 0 {
		grace = defaultShutdownGrace
	}
	in.log.Info().Dur("shutdown_grace", grace).Msg("shutting down: no new connections, finishing in-flight requests")
	graceCtx, cancelGrace := context.WithTimeout(ctx, grace)
	defer cancelGrace()
	in.shutdownCtx(graceCtx)
	in.log.Info().Msg("stopped")
	return 0
}

// shutdown ends the waits of requests in flight, lets them and their
// streams finish within grace, closes both listeners, then stops
// reloading. SIGHUP stays handled until then: its default action would
// end the process mid-grace.
func (in *instance) shutdown(grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	in.shutdownCtx(ctx)
}

// shutdownCtx is shutdown with the grace ending when ctx does.
func (in *instance) shutdownCtx(ctx context.Context) {
	err := in.p.Shutdown(ctx)
	_ = in.adminSrv.Shutdown(ctx)
	if err != nil {
		in.log.Warn().Err(err).Msg("shutdown grace period over; remaining connections closed")
	}
	in.stopWatching()
	<-in.watching
	signal.Stop(in.hup)
}

// loadConfig reads the file, or builds the embedded default, and applies
// the command-line and environment overrides.
func loadConfig(s settings) (*config.Config, error) {
	var cfg *config.Config
	if s.configPath == "" {
		cfg = config.Default(s.upstream)
	} else {
		var err error
		if cfg, err = config.Load(s.configPath); err != nil {
			return nil, err
		}
		if s.upstream != "" {
			if len(cfg.Upstreams) != 1 {
				return nil, errors.New("-upstream/STURDY_UPSTREAM: the config has several upstreams; set their url in the file instead")
			}
			cfg.Upstreams[0].URL = s.upstream
		}
	}
	if s.listen != "" {
		cfg.Listen = s.listen
	} else if d := os.Getenv("STURDY_DEFAULT_LISTEN"); d != "" && !cfg.Written("listen") {
		cfg.Listen = d // a container's default: the file's listen wins over it
	} else if s.demo {
		cfg.Listen = demoListen
	}
	file := ""
	if cfg.Written("admin_listen") || cfg.Written("admin.listen") {
		file = cfg.AdminListen
	}
	cfg.AdminListen = adminListen(s.adminListen, file)
	name := s.configPath
	if name == "" {
		name = "default config"
	}
	if ps := append(cfg.Validate(), cfg.Loops()...); len(ps) > 0 { // the listen address is final now
		return nil, &config.Error{File: name, Problems: ps}
	}
	if _, _, err := tracing.Resolve(tracing.File(cfg.Tracing), os.Getenv); err != nil {
		if k := "tracing.endpoint"; errors.Is(err, tracing.ErrNoExporters) && cfg.Tracing.Endpoint != "" {
			// The file asks for spans this build cannot send: its key and line.
			return nil, &config.Error{File: name, Problems: []config.Problem{{Key: k, Line: cfg.Line(k),
				Msg: err.Error()}}}
		}
		return nil, fmt.Errorf("tracing: %w", err)
	}
	return cfg, nil
}

// allowedHosts is server.allowed_hosts as policy.LocalHost compares
// them: lower case, no final dot.
func allowedHosts(cfg *config.Config) []string {
	var out []string
	for _, h := range cfg.Server.AllowedHosts {
		out = append(out, strings.ToLower(strings.TrimSuffix(h, ".")))
	}
	return out
}

// proxyOptions translates the config into the proxy's settings.
func proxyOptions(cfg *config.Config, logger zerolog.Logger, m *metrics.Metrics) proxy.Options {
	o := proxy.Options{Log: logger, Metrics: m, AuthKeys: cfg.Auth.Keys, IsSelf: isListener(cfg.Listen),
		Server: proxy.ServerLimits{ReadTimeout: cfg.Server.ReadTimeout.Std(), IdleTimeout: cfg.Server.IdleTimeout.Std(),
			MaxHeaderBytes: int(cfg.Server.MaxHeaderBytes), MaxConnections: cfg.Server.MaxConnections,
			WriteTimeout: cfg.Server.WriteTimeout.Std(), MaxBufferedBytes: int64(cfg.Server.MaxBufferedBytes),
			MaxRequestBytes: int64(cfg.Server.MaxRequestBytes),
			ReduceMemory:    cfg.Server.ReduceMemory, ReduceMemoryAbove: cfg.Server.ReduceMemoryAbove}, SharedState: sharedOptions(cfg.SharedState),
		Tracing: tracingOptions(cfg.Tracing)}
	o.Upstreams = cfg.Upstreams // one shape: the file decodes into upstream.Options
	for _, s := range cfg.Server.TrustedProxies {
		pfx, _ := config.ParsePrefix(s) // validated by config
		o.TrustedProxies = append(o.TrustedProxies, pfx)
	}
	o.AllowedHosts = allowedHosts(cfg)
	o.CORSOrigins = cfg.Server.CORSOrigins
	o.Clients, o.ClientKeys, o.Prices = cfg.Clients, cfg.ClientKeys, cfg.Prices
	o.Routes = cfg.Routes // one shape: the file decodes into proxy.Route
	return o
}

// isListener reports whether an address (host:port, as DNS discovery
// finds them) is the listener at listen (config.IsListener).
func isListener(listen string) func(addr string) bool {
	return func(addr string) bool {
		host, port, err := net.SplitHostPort(addr)
		return err == nil && config.IsListener(listen, host, port)
	}
}

// sharedOptions translates shared_state (nil: none).
func sharedOptions(s *config.SharedState) *proxy.SharedState {
	if s == nil {
		return nil
	}
	o := &proxy.SharedState{Refuse: s.OnFailure == "refuse", Config: fleet.Config{URL: s.RedisURL, MasterName: s.MasterName,
		SentinelAddrs: s.SentinelAddresses, Password: s.Password, Prefix: s.KeyPrefix, HashKey: s.HashKey,
		Timeout: s.Timeout.Std(), ShareBreakers: s.ShareBreakers}}
	return o
}

// tracingOptions resolves tracing from the file and the OTEL_*
// environment (nil: off). loadConfig has reported a wrong variable.
func tracingOptions(t config.Tracing) *proxy.Tracing {
	s, on, err := tracing.Resolve(tracing.File(t), os.Getenv)
	if err != nil || !on {
		return nil
	}
	return &proxy.Tracing{Settings: s, Version: version}
}

// newLogger builds the process logger and routes the standard library's
// log package through it, so with format json every line is JSON.
func newLogger(c config.Log, w io.Writer) zerolog.Logger {
	if c.Format == "console" {
		w = consoleWriter(w)
	}
	level, err := zerolog.ParseLevel(c.Level)
	if err != nil {
		level = zerolog.InfoLevel
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	logger := zerolog.New(w).Level(level).With().Timestamp().Logger()
	log.SetFlags(0)
	log.SetOutput(logger.With().Str("component", "stdlog").Logger())
	return logger
}

// consoleWriter is the console log format: colours only on a terminal,
// a request line led by what a person looks for (status, method, path,
// outcome, attempts, duration), times in ms to 0.1.
func consoleWriter(w io.Writer) zerolog.ConsoleWriter {
	f, ok := w.(*os.File)
	tty := ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
	return zerolog.ConsoleWriter{Out: w, NoColor: !tty, TimeFormat: "15:04:05",
		FieldsOrder: []string{"status", "method", "path", "outcome", "attempts", "duration_ms", "upstream", "endpoint", "error"},
		FormatPrepare: func(m map[string]any) error {
			if rs, ok := m["retries"].([]any); ok { // "5xx 300ms, connect 12ms"
				var parts []string
				for _, r := range rs {
					if r, ok := r.(map[string]any); ok {
						parts = append(parts, fmt.Sprintf("%v %vms", r["reason"], r["wait_ms"]))
					}
				}
				m["retries"] = strings.Join(parts, ", ")
			}
			for _, k := range []string{"duration_ms", "ttfb_ms", "ttft_ms"} {
				if n, ok := m[k].(json.Number); ok {
					if v, err := n.Float64(); err == nil {
						m[k] = math.Round(v*10) / 10
					}
				}
			}
			return nil
		},
		// What a person reading along can do without (the JSON format keeps
		// every field).
		FieldsExclude: []string{"id", "route", "stream", "bytes_out", "ttfb_ms", "ttft_ms", "breaker", "model_breaker", "targets", "endpoint"}}
}

// probeHealth asks the admin listener's /healthz; a wildcard listen
// address is probed on loopback.
func probeHealth(adminListen string, stderr io.Writer) int {
	host, port, err := net.SplitHostPort(adminListen)
	if err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 1
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + net.JoinHostPort(host, port) + "/healthz")
	if err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(stderr, "healthcheck: /healthz answered", resp.Status)
		return 1
	}
	return 0
}

func commitID() string {
	if commit != "" {
		return commit
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
