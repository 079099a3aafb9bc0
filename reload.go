package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/rs/zerolog"

	"sturdy/admin"
	"sturdy/config"
	"sturdy/metrics"
	"sturdy/proxy"
)

// reloadDebounce gathers the bursts of events an editor or a Kubernetes
// ConfigMap update makes into one reload.
const reloadDebounce = 200 * time.Millisecond

// settleEvery is how long a changed config file must go unchanged, read
// the same at both ends, before it is loaded. A file written in place
// (written to, not renamed over) must go inPlaceQuiet without a write: a
// writer that pauses between parts is not caught half-way. settleMax
// bounds the wait: a file still changing then is loaded as it stands (an
// invalid one is rejected; the running config keeps serving).
const (
	settleEvery  = time.Second
	inPlaceQuiet = 5 * time.Second
	settleMax    = time.Minute
)

// reloader applies a changed config to the running proxy: on SIGHUP and
// when the config file, or the client_keys_file it names, changes. An
// invalid config is rejected with the same message as -check, and the
// running one keeps serving.
type reloader struct {
	s       settings
	p       *proxy.Proxy
	m       *metrics.Metrics
	log     zerolog.Logger
	running *config.Config
	// current is running, for other goroutines (shutdown reads its
	// grace and delay).
	current atomic.Pointer[config.Config]
	// w watches the config file's directory and the client_keys_file's
	// (nil: not watching; reload with SIGHUP).
	w *fsnotify.Watcher
}

// files are the files whose change reloads: the config file and the
// client_keys_file it names (if any).
func (r *reloader) files() []string {
	var fs []string
	if r.s.configPath != "" {
		fs = append(fs, filepath.Clean(r.s.configPath))
	}
	if k := r.running.ClientKeysFile; k != "" {
		fs = append(fs, filepath.Clean(k))
	}
	return fs
}

// watchKeys watches the running config's client_keys_file's directory
// too (adding a directory already watched changes nothing).
func (r *reloader) watchKeys() {
	if r.w == nil || r.running.ClientKeysFile == "" {
		return
	}
	if err := r.w.Add(filepath.Dir(r.running.ClientKeysFile)); err != nil {
		r.log.Warn().Err(err).Msg("cannot watch client_keys_file; reload with SIGHUP")
	}
}

// changes reports whether ev is a change of one of the files: by name in
// its directory, or Kubernetes' ..data swap beside it.
func (r *reloader) changes(ev fsnotify.Event) bool {
	name := filepath.Clean(ev.Name)
	for _, f := range r.files() {
		if name == f || filepath.Base(name) == "..data" && filepath.Dir(name) == filepath.Dir(f) {
			return true
		}
	}
	return false
}

// readFiles reads the files that reload as one (a file that cannot be
// read reads as its error).
func (r *reloader) readFiles() []byte {
	var all []byte
	for _, f := range r.files() {
		b, err := os.ReadFile(f)
		if err != nil {
			b = []byte(err.Error())
		}
		all = append(append(all, b...), 0)
	}
	return all
}

// reload loads the config again and swaps it in; reason says what
// triggered it. It reports whether the new config was applied.
func (r *reloader) reload(reason string) bool {
	cfg, err := loadConfig(r.s)
	if err == nil {
		var warnings []string
		if warnings, err = r.p.Reload(proxyOptions(cfg, r.log, r.m)); err == nil {
			for _, w := range append(warnings, r.restartOnly(cfg)...) {
				r.log.Warn().Str("reason", reason).Msg("config reloaded, but " + w)
			}
			for _, w := range cfg.Warnings() {
				r.log.Warn().Str("reason", reason).Msg(describeProblem(r.s, w))
			}
			r.running = cfg
			r.current.Store(cfg)
			r.watchKeys()
			r.m.ConfigReloads.WithLabelValues("ok").Inc()
			r.log.Info().Str("reason", reason).Int("upstreams", len(cfg.Upstreams)).Int("routes", len(cfg.Routes)).
				Msg("config reloaded")
			return true
		}
	}
	r.m.ConfigReloads.WithLabelValues("rejected").Inc()
	r.log.Error().Str("reason", reason).Str("error", err.Error()).Msg("config rejected; the running config keeps serving")
	return false
}

// adminSettings is what the admin endpoints allow now (they hot-reload).
func (r *reloader) adminSettings() admin.Settings {
	cfg := r.current.Load()
	return admin.Settings{Pprof: cfg.Admin.Pprof, Token: cfg.Admin.Token, AllowedHosts: allowedHosts(cfg)}
}

// restartOnly lists the changed settings a reload cannot apply.
func (r *reloader) restartOnly(cfg *config.Config) []string {
	var out []string
	if cfg.Listen != r.running.Listen {
		out = append(out, "a new listen address takes effect after a restart")
	}
	if cfg.AdminListen != r.running.AdminListen {
		out = append(out, "a new admin listen address takes effect after a restart")
	}
	if cfg.Log != r.running.Log {
		out = append(out, "log settings take effect after a restart")
	}
	if !reflect.DeepEqual(cfg.Server.RestartOnly(), r.running.Server.RestartOnly()) || cfg.TLS != r.running.TLS {
		out = append(out, "server and tls settings take effect after a restart")
	}
	return out
}

// start begins watching: the config file's directory (so editors that
// replace the file and Kubernetes' symlink swaps are seen too) is watched
// before start returns; then a goroutine reloads on each signal from hup
// and on each change of the file until ctx ends. done closes when it has.
func (r *reloader) start(ctx context.Context, hup <-chan os.Signal) (done <-chan struct{}) {
	var w *fsnotify.Watcher
	if r.s.configPath != "" {
		var err error
		if w, err = fsnotify.NewWatcher(); err == nil {
			if err = w.Add(filepath.Dir(r.s.configPath)); err != nil {
				w.Close()
				w = nil
			}
		}
		if err != nil {
			r.log.Warn().Err(err).Msg("cannot watch the config file; reload with SIGHUP")
		}
	}
	r.w = w
	r.watchKeys()
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		r.loop(ctx, hup, w)
	}()
	return ch
}

// settled waits until the files go quiet — no event of theirs for
// settleEvery, or inPlaceQuiet once one was written in place — and read
// the same at both ends of the quiet, so a file written in parts is not
// loaded half-written. Write it atomically (a temporary file renamed over
// it) and this costs a second. inPlace says the change so far wrote a
// file in place. false: ctx ended.
func (r *reloader) settled(ctx context.Context, events <-chan fsnotify.Event, inPlace bool) bool {
	warned := false
	for end := time.Now().Add(settleMax); time.Now().Before(end); {
		d := settleEvery
		if inPlace {
			d = inPlaceQuiet
			if !warned {
				warned = true
				r.log.Warn().Dur("quiet", inPlaceQuiet).Msg("the config file is being written in place: it is loaded once no write " +
					"came for the quiet period (write it atomically, to a temporary file renamed over it, to reload at once)")
			}
		}
		before := r.readFiles()
		passed, ok := r.quiet(ctx, events, d, &inPlace)
		switch {
		case !ok:
			return false
		case passed && bytes.Equal(r.readFiles(), before):
			return true
		}
	}
	return true
}

// quiet waits d for no event of the files: passed when none came (an
// event that came marks inPlace when it wrote a file in place); ok is
// false when ctx ended.
func (r *reloader) quiet(ctx context.Context, events <-chan fsnotify.Event, d time.Duration, inPlace *bool) (passed, ok bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, false
		case ev := <-events:
			if r.changes(ev) {
				*inPlace = *inPlace || r.writtenInPlace(ev)
				return false, true
			}
		case <-t.C:
			return true, true
		}
	}
}

// writtenInPlace reports whether ev wrote one of the files itself (not a
// rename over it, nor Kubernetes' ..data swap).
func (r *reloader) writtenInPlace(ev fsnotify.Event) bool {
	return ev.Has(fsnotify.Write) && filepath.Base(ev.Name) != "..data"
}

func (r *reloader) loop(ctx context.Context, hup <-chan os.Signal, w *fsnotify.Watcher) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w != nil {
		defer w.Close()
		events, errs = w.Events, w.Errors
	}
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	inPlace := false // the change so far wrote a file in place
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload("SIGHUP")
		case ev := <-events:
			if r.changes(ev) {
				inPlace = inPlace || r.writtenInPlace(ev)
				debounce.Reset(reloadDebounce)
			}
		case err := <-errs:
			r.log.Warn().Err(err).Msg("config watch error")
		case <-debounce.C:
			settled := r.settled(ctx, events, inPlace)
			inPlace = false
			if settled {
				r.reload("config file changed")
			}
		}
	}
}
