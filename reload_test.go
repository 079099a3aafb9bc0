package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"sturdy/config"
	"sturdy/internal/upstreamtest"
)

const reloadConfig = `
upstreams:
  - name: steady
    url: STEADY
    breaker: {consecutive_failures: 2, open_for: 1m}
  - name: model
    url: MODEL
routes:
  - {name: steady, path_prefix: /steady/, upstream: steady, retry: {max_attempts: 1}}
  - {name: chat, path_prefix: /, upstream: model, retry: {max_attempts: 1}}
`

// reloadStack is Sturdy started from a config file by start(), the
// wiring serve() runs, on free loopback ports.
type reloadStack struct {
	path string
	url  string
	logs *upstreamtest.LogBuffer
	in   *instance
}

func startReloadable(t *testing.T, yaml string) *reloadStack {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sturdy.yaml")
	writeFile(t, path, yaml)
	return startFrom(t, path)
}

// startFrom starts Sturdy on the config file at path.
func startFrom(t *testing.T, path string) *reloadStack {
	t.Helper()
	s := settings{configPath: path, listen: "127.0.0.1:0", adminListen: "127.0.0.1:0"}
	cfg, err := loadConfig(s)
	if err != nil {
		t.Fatal(err)
	}
	logs := &upstreamtest.LogBuffer{}
	in, err := start(s, cfg, zerolog.New(logs))
	if err != nil {
		t.Fatalf("start: %v\n%s", err, logs.String())
	}
	t.Cleanup(func() { in.shutdown(5 * time.Second) })
	return &reloadStack{path: path, url: "http://" + in.ln.Addr().String(), logs: logs, in: in}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // the way editors and ConfigMaps replace files
		t.Fatal(err)
	}
}

var getBody = upstreamtest.Get

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func TestReloadOnFileChangeKeepsBreakerStateOfUnchangedUpstreams(t *testing.T) {
	t.Parallel()
	steady := upstreamtest.Start(t, upstreamtest.Step{Status: 500})
	a := upstreamtest.Start(t, upstreamtest.Step{Body: "from A"})
	b := upstreamtest.Start(t, upstreamtest.Step{Body: "from B"})
	yaml := strings.NewReplacer("STEADY", steady.URL).Replace(reloadConfig)
	s := startReloadable(t, strings.ReplaceAll(yaml, "MODEL", a.URL))

	// Open the steady upstream's breaker: 2 failures.
	getBody(t, s.url+"/steady/x")
	getBody(t, s.url+"/steady/x")
	if code, _ := getBody(t, s.url+"/steady/x"); code != 503 {
		t.Fatalf("breaker not open: %d", code)
	}
	if _, body := getBody(t, s.url+"/v1/models"); body != "from A" {
		t.Fatalf("before reload: %q", body)
	}

	writeFile(t, s.path, strings.ReplaceAll(yaml, "MODEL", b.URL))
	eventually(t, "requests to reach B", func() bool { _, body := getBody(t, s.url+"/v1/models"); return body == "from B" })
	if code, _ := getBody(t, s.url+"/steady/x"); code != 503 || steady.Count() != 2 {
		t.Fatalf("unchanged upstream lost its open breaker on reload: %d, %d requests", code, steady.Count())
	}
	eventually(t, "the reload logged", func() bool { return strings.Contains(s.logs.String(), `"reason":"config file changed"`) })
}

func TestInvalidConfigIsRejectedAndTheOldOneKeepsServing(t *testing.T) {
	t.Parallel()
	a := upstreamtest.Start(t, upstreamtest.Step{Body: "from A"})
	yaml := strings.NewReplacer("STEADY", a.URL, "MODEL", a.URL).Replace(reloadConfig)
	s := startReloadable(t, yaml)
	writeFile(t, s.path, yaml+"bogus_key: 1\n")
	eventually(t, "the rejection to be logged", func() bool { return strings.Contains(s.logs.String(), "config rejected") })
	if !strings.Contains(s.logs.String(), filepath.Base(s.path)+":11: bogus_key: unknown key") {
		t.Fatalf("rejection does not say what -check says: %s", s.logs.String())
	}
	if code, body := getBody(t, s.url+"/v1/models"); code != 200 || body != "from A" {
		t.Fatalf("old config stopped serving: %d %q", code, body)
	}
}

// TestSIGHUPReloads sends the process a real SIGHUP. The config file is a
// symlink into another directory and the file it names is changed in
// place: the file watcher (on the symlink's directory) cannot see that, so
// only the signal can make Sturdy reload. Not parallel: every Sturdy the
// process runs gets the signal.
func TestSIGHUPReloads(t *testing.T) {
	a := upstreamtest.Start(t, upstreamtest.Step{Body: "from A"})
	b := upstreamtest.Start(t, upstreamtest.Step{Body: "from B"})
	yaml := strings.NewReplacer("STEADY", a.URL).Replace(reloadConfig)
	real := filepath.Join(t.TempDir(), "real.yaml")
	writeFile(t, real, strings.ReplaceAll(yaml, "MODEL", a.URL))
	link := filepath.Join(t.TempDir(), "sturdy.yaml")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	s := startFrom(t, link)
	if err := os.WriteFile(real, []byte(strings.ReplaceAll(yaml, "MODEL", b.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * reloadDebounce)
	if _, body := getBody(t, s.url+"/v1/models"); body != "from A" {
		t.Fatalf("reloaded without a signal: the test cannot tell SIGHUP worked (%q)", body)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "requests to reach B", func() bool { _, body := getBody(t, s.url+"/v1/models"); return body == "from B" })
	// The line is written just after the new config takes over.
	eventually(t, "the reload logged as SIGHUP", func() bool { return strings.Contains(s.logs.String(), `"reason":"SIGHUP"`) })
}

func TestInFlightStreamSurvivesReload(t *testing.T) {
	t.Parallel()
	a := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE("a", "b", "c", "d", "e"), ChunkDelay: 100 * time.Millisecond})
	b := upstreamtest.Start(t, upstreamtest.Step{Body: "from B"})
	yaml := strings.NewReplacer("STEADY", a.URL).Replace(reloadConfig)
	s := startReloadable(t, strings.ReplaceAll(yaml, "MODEL", a.URL))
	resp, err := http.Post(s.url+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	writeFile(t, s.path, strings.ReplaceAll(yaml, "MODEL", b.URL))
	body, err := io.ReadAll(resp.Body)
	if err != nil || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("stream cut by reload: %v %q", err, body)
	}
	eventually(t, "requests to reach B", func() bool { _, body := getBody(t, s.url+"/v1/models"); return body == "from B" })
}

// TestAdminBindFailureIsFatal is not parallel: run's newLogger sets
// zerolog's global time format.
func TestAdminBindFailureIsFatal(t *testing.T) {
	busy := upstreamtest.Start(t) // something already on the port
	var out, errb bytes.Buffer
	code := run([]string{"-upstream", "http://127.0.0.1:1", "-listen", "127.0.0.1:0", "-admin-listen", busy.Addr}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "cannot bind the admin listener") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	t.Setenv("STURDY_UPSTREAM", "http://127.0.0.1:7777")
	t.Setenv("STURDY_LISTEN", "127.0.0.1:7070")
	t.Setenv("STURDY_ADMIN_LISTEN", "127.0.0.1:7071")
	var out, errb bytes.Buffer
	if code := run([]string{"-check"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	t.Setenv("STURDY_CONFIG", "does-not-exist.yaml")
	if code := run([]string{"-check"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "does-not-exist.yaml") {
		t.Fatalf("STURDY_CONFIG ignored: exit %d, %q", code, errb.String())
	}
}

// TestHealthcheckFlag is not parallel: nothing may listen on the port
// freeAddr closed, which another test could take.
func TestHealthcheckFlag(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	var out, errb bytes.Buffer
	if code := run([]string{"-healthcheck", "-admin-listen", freeAddr(t)}, &out, &errb); code != 1 {
		t.Fatalf("healthcheck with nothing listening: exit %d", code)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			_, _ = w.Write([]byte("ok\n"))
		}
	}), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	if code := run([]string{"-healthcheck", "-admin-listen", addr}, &out, &errb); code != 0 {
		t.Fatalf("healthcheck: exit %d, %s", code, errb.String())
	}
}

func TestRestartOnlyServerKeysAreTold(t *testing.T) {
	t.Parallel()
	base := config.Default("http://127.0.0.1:1")
	r := &reloader{running: base}
	trusted := *base
	trusted.Server.TrustedProxies = []string{"10.0.0.0/8"}
	if w := r.restartOnly(&trusted); len(w) != 0 {
		t.Fatalf("trusted_proxies hot-reloads, but the reload warns: %v", w)
	}
	slow := *base
	slow.Server.WriteTimeout = config.Duration(time.Second)
	if w := r.restartOnly(&slow); len(w) != 1 || !strings.Contains(w[0], "server") {
		t.Fatalf("write_timeout needs a restart, warnings %v", w)
	}
}

// TestAFileWrittenInPartsIsNotLoadedHalfWritten: a config written in
// place in two parts 1.5 s apart, whose first part alone is a valid
// config of its own, is loaded only once whole: a file written in place
// waits inPlaceQuiet without a write. Before, the rule was two reads a
// second apart that agree, which a writer pausing longer passed: its
// first part was applied.
func TestAFileWrittenInPartsIsNotLoadedHalfWritten(t *testing.T) {
	t.Parallel()
	a := upstreamtest.Start(t, upstreamtest.Step{Body: "from A"})
	b := upstreamtest.Start(t, upstreamtest.Step{Body: "from B"})
	c := upstreamtest.Start(t, upstreamtest.Step{Body: "from C"})
	s := startReloadable(t, "upstreams:\n  - name: model\n    url: "+a.URL+"\n")
	first := "upstreams:\n  - name: model\n    url: " + b.URL + "\n" // valid alone: everything to B
	rest := "  - name: other\n    url: " + c.URL + "\nroutes:\n  - {name: chat, path_prefix: /, upstream: other}\n"
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_TRUNC, 0o600) // in place, as some tools write
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(first); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if _, err := f.WriteString(rest); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for deadline := time.Now().Add(inPlaceQuiet + 5*time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, body := getBody(t, s.url+"/v1/models")
		if body == "from B" {
			t.Fatal("the half-written config was applied")
		}
		if body == "from C" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the whole config was never applied:\n%s", s.logs.String())
		}
	}
	reloads := func() int { return strings.Count(s.logs.String(), `"message":"config reloaded"`) }
	eventually(t, "the reload logged", func() bool { return reloads() > 0 })
	time.Sleep(2 * settleEvery) // time for a second one, were it coming
	if n := reloads(); n != 1 {
		t.Fatalf("%d reloads, want 1:\n%s", n, s.logs.String())
	}
}

// TestAChangedClientKeysFileReloads: client_keys_file, in a directory of
// its own, is watched: a change applies, an invalid one is rejected with
// its file, key and line, and the running keys keep serving.
func TestAChangedClientKeysFileReloads(t *testing.T) {
	t.Parallel()
	a := upstreamtest.Start(t, upstreamtest.Step{Body: "from A"})
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	const hash = "3fc923743166bae134970eb2789df5145d8b8041e050acf18067986818f41d13" // sha256("sk-team")
	writeFile(t, keys, "keys:\n  - {sha256: "+hash+", name: team, requests_per_second: 0.001, burst: 1}\n")
	s := startReloadable(t, "client_keys_file: "+keys+"\nupstreams: [{name: model, url: "+a.URL+"}]\n")
	get := func() int {
		req, _ := http.NewRequest("GET", s.url+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer sk-team")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if first, second := get(), get(); first != 200 || second != 429 {
		t.Fatalf("%d then %d, want 200 then the key's own limit's 429", first, second)
	}
	writeFile(t, keys, "keys:\n  - {sha256: "+hash+", name: team, requests_per_second: 100}\n")
	eventually(t, "the key's new limit", func() bool { return get() == 200 })
	writeFile(t, keys, "keys:\n  - {sha256: "+hash+", name: team}\n  - {sha256: nothex}\n")
	eventually(t, "the rejection to be logged", func() bool { return strings.Contains(s.logs.String(), "config rejected") })
	if !strings.Contains(s.logs.String(), "keys.yaml:3: keys[1].sha256: must be 64 hex digits") {
		t.Fatalf("the rejection does not name the keys file, its line and key: %s", s.logs.String())
	}
	if get() != 200 {
		t.Fatal("the running keys stopped serving")
	}
	if strings.Contains(s.logs.String(), "sk-team") {
		t.Fatal("a client key reached the log")
	}
}
