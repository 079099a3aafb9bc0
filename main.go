// Command sturdy is a resilient reverse proxy for OpenAI-compatible model
// servers: point an agent's baseURL at it and it absorbs the upstream's
// passing faults (retries with full jitter, Retry-After, circuit breaker)
// while passing the client's own mistakes back untouched.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"sturdy/breaker"
	"sturdy/config"
	"sturdy/policy"
	"sturdy/proxy"
)

// version is stamped at build time with -ldflags "-X main.version=…".
var version = "dev"

// shutdownGrace is how long in-flight requests and streams get to finish
// after SIGINT/SIGTERM.
const shutdownGrace = 30 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sturdy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "config file (YAML); without it Sturdy forwards everything to -upstream")
	upstreamURL := fs.String("upstream", "", "upstream URL (default "+config.DefaultUpstreamURL+"); with -config, replaces the url of its only upstream")
	listen := fs.String("listen", "", "listen address, overriding the config's (default :8080)")
	check := fs.Bool("check", false, "validate the config, print what is wrong, exit 0 (valid) or 2 (invalid)")
	showVersion := fs.Bool("version", false, "print version, commit and Go version")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Fprintf(stdout, "sturdy %s (commit %s, %s)\n", version, commit(), runtime.Version())
		return 0
	}
	cfg, err := loadConfig(*configPath, *upstreamURL, *listen)
	if err != nil {
		config.WriteProblems(stderr, err)
		return 2
	}
	if *check {
		fmt.Fprintln(stdout, "config OK")
		return 0
	}
	logger := newLogger(cfg.Log, stderr)
	p, err := proxy.New(proxyOptions(cfg, logger))
	if err != nil {
		logger.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		logger.Error().Err(err).Str("listen", cfg.Listen).Msg("cannot listen")
		return 1
	}
	srv := p.Server()
	logger.Info().Str("listen", ln.Addr().String()).Str("version", version).Msg("sturdy started")

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case err := <-served:
		logger.Error().Err(err).Msg("server stopped")
		return 1
	case s := <-sig:
		logger.Info().Str("signal", s.String()).Msg("shutting down: finishing in-flight requests")
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err = srv.ShutdownWithContext(ctx)
	p.CloseIdleConnections()
	if err != nil {
		logger.Warn().Err(err).Msg("shutdown grace period over; remaining connections closed")
	}
	logger.Info().Msg("stopped")
	return 0
}

// loadConfig reads the file, or builds the embedded default, and applies
// the command-line overrides.
func loadConfig(path, upstreamURL, listen string) (*config.Config, error) {
	var cfg *config.Config
	if path == "" {
		cfg = config.Default(upstreamURL)
	} else {
		var err error
		if cfg, err = config.Load(path); err != nil {
			return nil, err
		}
		if upstreamURL != "" {
			if len(cfg.Upstreams) != 1 {
				return nil, errors.New("-upstream: the config has several upstreams; set their url in the file instead")
			}
			cfg.Upstreams[0].URL = upstreamURL
		}
	}
	if listen != "" {
		cfg.Listen = listen
	}
	name := path
	if name == "" {
		name = "default config"
	}
	if ps := cfg.Validate(); len(ps) > 0 {
		return nil, &config.Error{File: name, Problems: ps}
	}
	return cfg, nil
}

// proxyOptions translates the config into the proxy's settings.
func proxyOptions(cfg *config.Config, logger zerolog.Logger) proxy.Options {
	o := proxy.Options{Log: logger}
	for _, u := range cfg.Upstreams {
		b := u.Breaker
		o.Upstreams = append(o.Upstreams, proxy.Upstream{
			Name: u.Name, URL: u.URL, APIKey: u.APIKey,
			ConnectTimeout:   u.Timeouts.Connect.Std(),
			FirstByteTimeout: u.Timeouts.FirstByte.Std(),
			IdleTimeout:      u.Timeouts.Idle.Std(),
			MaxConnections:   u.MaxConnections,
			Breaker: breaker.Settings{
				ConsecutiveFailures: uint32(b.ConsecutiveFailures),
				FailureRatio:        b.FailureRatio,
				MinRequests:         uint32(b.MinRequests),
				Window:              b.Window.Std(),
				OpenFor:             b.OpenFor.Std(),
				HalfOpenRequests:    uint32(b.HalfOpenRequests),
			},
		})
	}
	for _, r := range cfg.Routes {
		on, _ := policy.ParseRetryOn(r.Retry.On) // validated by config
		o.Routes = append(o.Routes, proxy.Route{
			Name: r.Name, PathPrefix: r.PathPrefix, Upstream: r.Upstream,
			Deadline: r.Deadline.Std(),
			MaxBody:  int(r.MaxBody),
			Retry: policy.Retry{
				MaxAttempts:   r.Retry.MaxAttempts,
				Backoff:       policy.Backoff{Base: r.Retry.BaseDelay.Std(), Max: r.Retry.MaxDelay.Std()},
				MaxRetryAfter: r.Retry.MaxRetryAfter.Std(),
				On:            on,
				ReplayWrites:  r.Retry.ReplayWrites,
			},
		})
	}
	return o
}

// newLogger builds the process logger and routes the standard library's
// log package through it, so with format json every line is JSON.
func newLogger(c config.Log, w io.Writer) zerolog.Logger {
	if c.Format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
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

func commit() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
