package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"sturdy/config"
	"sturdy/internal/upstreamtest"
	"sturdy/proxy"
)

// TestMain runs at least 8 parallel tests at once: they mostly wait on
// the binaries and servers they start (upstreamtest.RaiseParallel).
func TestMain(m *testing.M) {
	upstreamtest.RaiseParallel(8)
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir) // the binary buildOnce built: 40 MB a run otherwise left behind
	}
	os.Exit(code)
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := run([]string{"-version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "sturdy ") || !strings.Contains(out.String(), "go1") {
		t.Fatalf("exit %d, %q", code, out.String())
	}
}

func TestCheckAcceptsTheExampleConfig(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := run([]string{"-check", "-config", "config.example.yaml"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}

func TestCheckRejectsAnInvalidConfigWithKeyAndLine(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bad.yaml")
	yaml := "listen: \":8080\"\nupstreams:\n  - name: a\n    url: http://127.0.0.1:1\nroutes:\n  - name: r\n    upstream: b\n    retry: {max_attempts: 0}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"-check", "-config", path}, {"-config", path}} {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		msg := errb.String()
		if code != 2 || !strings.Contains(msg, path+":7: routes[0].upstream: unknown upstream \"b\"") ||
			!strings.Contains(msg, path+":8: routes[0].retry.max_attempts: must be at least 1") {
			t.Fatalf("%v: exit %d, stderr %q", args, code, msg)
		}
	}
}

// TestCheckRefusesAnUpstreamAtTheFinalListenAddress: an upstream at
// Sturdy's own listen address is refused with key and line — the
// address as -listen (or STURDY_LISTEN) makes it, not the file's alone.
func TestCheckRefusesAnUpstreamAtTheFinalListenAddress(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("upstreams:\n  - name: a\n    url: http://127.0.0.1:8080\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		code int
	}{
		{[]string{"-check", "-config", path}, 2}, // the file's listen: the default :8080
		{[]string{"-check", "-config", path, "-listen", ":9000"}, 0},
		{[]string{"-check", "-config", path, "-listen", "127.0.0.1:8080"}, 2},
	} {
		var out, errb bytes.Buffer
		code := run(tt.args, &out, &errb)
		if code != tt.code || code == 2 && !strings.Contains(errb.String(), path+":3: upstreams[0].url: \"http://127.0.0.1:8080\" is Sturdy's own listen address") {
			t.Errorf("%v: exit %d, stderr %q", tt.args, code, errb.String())
		}
	}
}

func TestUpstreamFlagWithoutConfig(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(settings{upstream: "http://127.0.0.1:9999/base", listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstreams[0].URL != "http://127.0.0.1:9999/base" || cfg.Listen != "127.0.0.1:0" || cfg.Routes[0].Upstream != config.DefaultUpstreamName {
		t.Fatalf("%+v", cfg)
	}
	if _, err := loadConfig(settings{upstream: "ftp://nope"}); err == nil {
		t.Fatal("bad -upstream accepted")
	}
}

// buildOnce builds the sturdy binary once per test run, into builtDir
// (removed as the run ends).
var buildOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sturdy-bin")
	if err != nil {
		return "", err
	}
	builtDir = dir
	bin := filepath.Join(dir, "sturdy")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build: %v\n%s", err, out)
	}
	return bin, nil
})

var builtDir string

// sturdyProc is a running sturdy binary.
type sturdyProc struct {
	cmd    *exec.Cmd
	logs   *upstreamtest.LogBuffer
	addr   string        // its listen address
	exited chan struct{} // closed when it has exited; err is then set
	err    error
}

// runBinary runs the built binary until the test ends. args gets a
// listen and an admin address; ports are picked free, and if the binary
// cannot bind them (another test took one meanwhile) it is started again
// on new ones. It returns once the binary accepts connections.
func runBinary(t *testing.T, args func(listen, admin string) []string) *sturdyProc {
	t.Helper()
	return runBinaryCmd(t, exec.Command, args)
}

// runBinaryCmd is runBinary with the command made by cmd (to run the
// binary under a shell that sets limits first, say).
func runBinaryCmd(t *testing.T, cmd func(bin string, args ...string) *exec.Cmd, args func(listen, admin string) []string) *sturdyProc {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	for try := 1; ; try++ {
		p := &sturdyProc{logs: &upstreamtest.LogBuffer{}, addr: freeAddr(t), exited: make(chan struct{})}
		p.cmd = cmd(bin, args(p.addr, freeAddr(t))...)
		p.cmd.Stderr = p.logs
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.err = p.cmd.Wait(); close(p.exited) }()
		t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.exited })
		// Its own startup line (JSON or console) says it listens: a dial
		// alone could reach another test's server that took the port first.
		listening := []string{`"listen":"` + p.addr + `"`, " listen=" + p.addr + " "}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if out := p.logs.String(); strings.Contains(out, listening[0]) || strings.Contains(out, listening[1]) {
				return p
			}
			select {
			case <-p.exited:
			case <-time.After(20 * time.Millisecond):
				if time.Now().Before(deadline) {
					continue
				}
				t.Fatalf("sturdy never listened on %s:\n%s", p.addr, p.logs.String())
			}
			break
		}
		if out := p.logs.String(); try >= 3 || !strings.Contains(out, "cannot") {
			t.Fatalf("sturdy exited (%v) before listening:\n%s", p.err, out)
		}
	}
}

// waitExit waits for the process to end and returns its exit error.
func (p *sturdyProc) waitExit(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(within):
		t.Fatalf("sturdy did not exit within %v:\n%s", within, p.logs.String())
		return nil
	}
}

// TestSIGTERMLetsInFlightStreamsFinish opens 100 slow streams through the
// binary, sends SIGTERM, and checks every stream completes, new
// connections are refused and the process exits 0.
func TestSIGTERMLetsInFlightStreamsFinish(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE("a", "b", "c", "d", "e", "f", "g", "h"), ChunkDelay: 100 * time.Millisecond})
	p := runBinary(t, func(listen, admin string) []string {
		return []string{"-upstream", up.URL, "-listen", listen, "-admin-listen", admin}
	})
	addr := p.addr

	const streams = 100
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: streams, MaxIdleConnsPerHost: streams}}
	started := make(chan struct{}, streams)
	results := make(chan error, streams)
	for i := 0; i < streams; i++ {
		go func() {
			resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
			if err != nil {
				started <- struct{}{}
				results <- err
				return
			}
			defer resp.Body.Close()
			r := bufio.NewReader(resp.Body)
			_, err = r.ReadString('\n') // the stream has started
			started <- struct{}{}
			if err != nil {
				results <- err
				return
			}
			rest, err := io.ReadAll(r)
			if err == nil && !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
				err = fmt.Errorf("stream cut: %q", rest)
			}
			results <- err
		}()
	}
	for i := 0; i < streams; i++ {
		<-started
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("new connections still accepted during shutdown")
	}
	for i := 0; i < streams; i++ {
		if err := <-results; err != nil {
			t.Fatalf("in-flight stream failed during shutdown: %v", err)
		}
	}
	if err := p.waitExit(t, 10*time.Second); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.logs.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(p.logs.String()), "\n") {
		if !strings.HasPrefix(line, "{") {
			t.Fatalf("non-JSON log line: %q", line)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestDemoServesWithNoModelInstalled runs `sturdy -demo` and talks to it.
func TestDemoServesWithNoModelInstalled(t *testing.T) {
	t.Parallel()
	addr := runBinary(t, func(listen, admin string) []string {
		return []string{"-demo", "-listen", listen, "-admin-listen", admin}
	}).addr
	ok := 0
	for i := 0; i < 5; i++ {
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"demo","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && strings.Contains(string(body), "chat.completion.chunk") {
			ok++
		}
	}
	if ok < 4 {
		t.Fatalf("only %d of 5 demo requests succeeded", ok)
	}
}

// TestSIGHUPDuringShutdownDoesNotKill sends SIGHUP while a SIGTERM'd
// binary drains a slow request: the request still completes and the
// process exits 0 (SIGHUP's default action would end it at once).
func TestSIGHUPDuringShutdownDoesNotKill(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Delay: 1500 * time.Millisecond, Body: "slow but whole"})
	p := runBinary(t, func(listen, admin string) []string {
		return []string{"-upstream", up.URL, "-listen", listen, "-admin-listen", admin}
	})
	done := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + p.addr + "/v1/models")
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	for deadline := time.Now().Add(5 * time.Second); up.Count() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the upstream")
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if body := <-done; body != "slow but whole" {
		t.Fatalf("in-flight request during shutdown: %q", body)
	}
	if err := p.waitExit(t, 10*time.Second); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.logs.String())
	}
}

// TestDrainThenSecondSignal: SIGTERM turns /readyz 503 at once while
// shutdown_delay keeps serving; a second SIGTERM ends the drain now: the
// open stream gets its stream_interrupted event and the process exits 0.
func TestDrainThenSecondSignal(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE(upstreamtest.Words(60, "tok")...), ChunkDelay: 100 * time.Millisecond})
	cfg := filepath.Join(t.TempDir(), "sturdy.yaml")
	yaml := fmt.Sprintf("server: {shutdown_delay: 1s, shutdown_grace: 30s}\nupstreams: [{name: up, url: %q}]\n", up.URL)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var admin string
	p := runBinary(t, func(listen, adminAddr string) []string {
		admin = adminAddr
		return []string{"-config", cfg, "-listen", listen, "-admin-listen", adminAddr}
	})
	stream := make(chan string, 1)
	go func() {
		resp, err := http.Post("http://"+p.addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
		if err != nil {
			stream <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		stream <- string(b)
	}()
	time.Sleep(300 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if code, _ := upstreamtest.Get(t, "http://"+admin+"/readyz"); code != 503 {
		t.Fatalf("/readyz answered %d while draining", code)
	}
	resp, err := http.Get("http://" + p.addr + "/v1/models")
	if err != nil {
		t.Fatalf("not serving during shutdown_delay: %v", err)
	}
	resp.Body.Close()
	time.Sleep(1200 * time.Millisecond) // past the delay: draining now
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	body := <-stream
	if !strings.Contains(body, `"code":"stream_interrupted"`) || strings.Contains(body, "[DONE]") {
		t.Fatalf("the open stream after a second signal: %q", body)
	}
	if err := p.waitExit(t, 5*time.Second); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.logs.String())
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the second signal took %v to end the drain", took)
	}
}

// TestTheDefaultAdminAddressTakenIsNotFatal: with 127.0.0.1:9090 held
// (by this test, or by whoever already holds it), Sturdy started without
// an admin address warns and serves; an admin address given explicitly
// that is taken stays fatal. Not parallel: the binary it starts itself
// listens on a port freeAddr closed, which another test could take.
func TestTheDefaultAdminAddressTakenIsNotFatal(t *testing.T) {
	if ln, err := net.Listen("tcp", config.DefaultAdminListen); err == nil {
		defer ln.Close()
	}
	p := runBinary(t, func(listen, _ string) []string { return []string{"-listen", listen} })
	resp, err := http.Get("http://" + p.addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if logs := p.logs.String(); !strings.Contains(logs, "admin listener off") || !strings.Contains(logs, "sturdy started") {
		t.Fatalf("no warning, or no start:\n%s", logs)
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-listen", freeAddr(t), "-admin-listen", taken.Addr().String()).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "cannot bind the admin listener") {
		t.Fatalf("an explicit admin address that is taken: %v\n%s", err, out)
	}
}

// TestTheStartupLineSaysWhatRuns: upstreams with their URLs, routes, and
// in -demo the fake server and its faults.
func TestTheStartupLineSaysWhatRuns(t *testing.T) {
	t.Parallel()
	p := runBinary(t, func(listen, admin string) []string {
		return []string{"-demo", "-listen", listen, "-admin-listen", admin}
	})
	wants := []string{"sturdy started", "demo-llm", "http://127.0.0.1:", "/ → demo-llm", "demo mode", "down from 60s"}
	// The binary accepts connections before it has logged every line: the
	// lines are waited for, up to 5 s.
	all := func(logs string) bool {
		for _, want := range wants {
			if !strings.Contains(logs, want) {
				return false
			}
		}
		return true
	}
	logs := p.logs.String()
	for deadline := time.Now().Add(5 * time.Second); !all(logs) && time.Now().Before(deadline); logs = p.logs.String() {
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range wants {
		if !strings.Contains(logs, want) {
			t.Errorf("the startup log lacks %q:\n%s", want, logs)
		}
	}
}

// TestCheckWarnsOfAURLEndingInV1: -check says so, with the fix, and the
// config is still valid.
func TestCheckWarnsOfAURLEndingInV1(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run([]string{"-check", "-upstream", "http://127.0.0.1:8000/v1"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if s := out.String(); !strings.Contains(s, "warning: -upstream: upstreams[0].url: ends in /v1") || !strings.Contains(s, "did you mean http://127.0.0.1:8000?") {
		t.Fatalf("output %q", s)
	}
}

// TestContainerDefaultsYieldToTheFile: STURDY_DEFAULT_LISTEN and
// STURDY_DEFAULT_ADMIN_LISTEN (the Dockerfile's) apply where the file is
// silent; a mounted file's listen and admin_listen win over them.
func TestContainerDefaultsYieldToTheFile(t *testing.T) {
	t.Setenv("STURDY_DEFAULT_LISTEN", ":8080")
	t.Setenv("STURDY_DEFAULT_ADMIN_LISTEN", ":9090")
	cfg, err := loadConfig(settings{})
	if err != nil || cfg.Listen != ":8080" || cfg.AdminListen != ":9090" {
		t.Fatalf("no file: %v %q %q", err, cfg.Listen, cfg.AdminListen)
	}
	path := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:7000\nadmin_listen: 127.0.0.1:7001\nupstreams: [{name: a, url: http://h}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = loadConfig(settings{configPath: path})
	if err != nil || cfg.Listen != "127.0.0.1:7000" || cfg.AdminListen != "127.0.0.1:7001" {
		t.Fatalf("the file's addresses lost to the container defaults: %v %q %q", err, cfg.Listen, cfg.AdminListen)
	}
	cfg, err = loadConfig(settings{configPath: path, listen: "127.0.0.1:7002"})
	if err != nil || cfg.Listen != "127.0.0.1:7002" {
		t.Fatalf("the flag lost to the file: %v %q", err, cfg.Listen)
	}
}

// TestTheDemoListensOnLoopback: -demo binds 127.0.0.1:8080 unless told
// otherwise (-listen, STURDY_LISTEN, an image's STURDY_DEFAULT_LISTEN).
// Before, it listened on every interface, a toy open to the network.
func TestTheDemoListensOnLoopback(t *testing.T) {
	demo := settings{demo: true, upstream: "http://127.0.0.1:1"}
	cfg, err := loadConfig(demo)
	if err != nil || cfg.Listen != "127.0.0.1:8080" {
		t.Fatalf("-demo: %v, listen %q, want 127.0.0.1:8080", err, cfg.Listen)
	}
	told := demo
	told.listen = ":8081"
	if cfg, err = loadConfig(told); err != nil || cfg.Listen != ":8081" {
		t.Fatalf("-demo -listen :8081: %v, listen %q", err, cfg.Listen)
	}
	t.Setenv("STURDY_DEFAULT_LISTEN", ":8080") // the image's
	if cfg, err = loadConfig(demo); err != nil || cfg.Listen != ":8080" {
		t.Fatalf("-demo in the image: %v, listen %q, want :8080", err, cfg.Listen)
	}
}

// TestTheDemoShowsAClientMistakePassingThrough: the demo's fake server
// refuses what a real one would, and Sturdy hands that back untouched.
func TestTheDemoShowsAClientMistakePassingThrough(t *testing.T) {
	t.Parallel()
	addr := runBinary(t, func(listen, admin string) []string {
		return []string{"-demo", "-listen", listen, "-admin-listen", admin}
	}).addr
	for _, tt := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/v1/nonexistent", `{"model":"demo"}`, 404, `"code":"not_found"`},
		{"/v1/chat/completions", `{"model":"demo"}`, 400, `missing required parameter: 'messages'`},
		{"/v1/chat/completions", `not json`, 400, `not valid JSON`},
	} {
		resp, err := http.Post("http://"+addr+tt.path, "application/json", strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.want) || resp.Header.Get("X-Sturdy-Attempts") != "" {
			t.Errorf("%s %s: %d %s (attempts %q)", tt.path, tt.body, resp.StatusCode, b, resp.Header.Get("X-Sturdy-Attempts"))
		}
	}
}

// TestTheConsoleFormatReadsAtAGlance: no colours off a terminal, the
// request line led by status, method, path, outcome, attempts and
// duration (to 0.1 ms), retries in short words. Not parallel: newLogger
// sets zerolog's global time format.
func TestTheConsoleFormatReadsAtAGlance(t *testing.T) {
	var buf bytes.Buffer
	logger := newLogger(config.Log{Level: "info", Format: "console"}, &buf)
	logger.Info().Str("upstream", "u").Str("id", "x-1").Float64("duration_ms", 12.3456).Int("attempts", 2).
		Str("outcome", "ok").Str("path", "/v1/chat/completions").Str("method", "POST").Int("status", 200).
		RawJSON("retries", []byte(`[{"reason":"5xx","endpoint":"h:1","wait_ms":300}]`)).Msg("request")
	line := buf.String()
	want := `request status=200 method=POST path=/v1/chat/completions outcome=ok attempts=2 duration_ms=12.3 upstream=u retries="5xx 300ms"`
	if strings.Contains(line, "\x1b[") || !strings.Contains(line, want) || strings.Contains(line, "x-1") {
		t.Fatalf("console line %q, want it to contain %q, no colour and no id", line, want)
	}
}

// TestListeningEverywhereWithoutAuthIsWarned: the startup warns when the
// listen address is every interface and no client key is required.
func TestListeningEverywhereWithoutAuthIsWarned(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0") // the check reads the configured address, not this one
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tt := range []struct {
		listen string
		keys   []string
		warned bool
	}{{":8080", nil, true}, {"0.0.0.0:8080", nil, true}, {"127.0.0.1:8080", nil, false}, {":8080", []string{"k-0123456789abcdef"}, false}} {
		var buf bytes.Buffer
		cfg, err := loadConfig(settings{})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listen, cfg.Auth.Keys = tt.listen, tt.keys
		startupLine(zerolog.New(&buf), settings{}, cfg, &instance{ln: ln})
		if got := strings.Contains(buf.String(), "listening on every interface with no client auth"); got != tt.warned {
			t.Errorf("listen %q keys %d: warned %v\n%s", tt.listen, len(tt.keys), got, buf.String())
		}
	}
}

// TestAnUpstreamNotAnsweringAtStartIsWarnedOnce: with nothing listening at
// the upstream, the log says so once, with the URL, the OS's words and the
// hint to try -demo; and the demo's banner says when its outage comes and
// how to watch it.
func TestAnUpstreamNotAnsweringAtStartIsWarnedOnce(t *testing.T) {
	t.Parallel()
	dead := freeAddr(t) // nothing listens there
	p := runBinary(t, func(listen, admin string) []string {
		return []string{"-upstream", "http://" + dead, "-listen", listen, "-admin-listen", admin}
	})
	demo := runBinary(t, func(listen, admin string) []string {
		return []string{"-demo", "-listen", listen, "-admin-listen", admin}
	})
	const warning = "the upstream does not answer at start"
	logs := p.logs.String()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs, warning) && time.Now().Before(deadline); logs = p.logs.String() {
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{warning, "http://" + dead, "connection refused", "try -demo"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Count(logs, warning) != 1 {
		t.Errorf("want one warning:\n%s", logs)
	}
	banner := demo.logs.String()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(banner, "outage_at") && time.Now().Before(deadline); banner = demo.logs.String() {
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{"outage comes about a minute in", "outage_at", "watch it: while sleep 1; do curl"} {
		if !strings.Contains(banner, want) {
			t.Errorf("the demo's banner lacks %q:\n%s", want, banner)
		}
	}
	// The command works as copied: its body is the JSON the demo answers.
	_, cmd, _ := strings.Cut(banner, "watch it: ")
	_, body, _ := strings.Cut(cmd, " -d '")
	body, _, _ = strings.Cut(body, "'")
	resp, err := http.Post("http://"+demo.addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 && resp.StatusCode != 429 && resp.StatusCode < 500 {
		t.Errorf("the watch command's body %q: %d", body, resp.StatusCode)
	}
	if strings.Contains(banner, warning) {
		t.Errorf("the demo's fake server was reported not answering:\n%s", banner)
	}
}

// TestAWrittenZeroLoads: slow_start: 0 and max_rescues: 0 ("none") pass
// the loader, which validates again after the file's own checks, and
// reach the proxy as none.
func TestAWrittenZeroLoads(t *testing.T) {
	t.Parallel()
	o := optionsOf(t, "upstreams: [{name: a, url: 'http://127.0.0.1:1', slow_start: 0}]\nroutes: [{name: r, upstream: a, max_rescues: 0}]\n")
	if s, r := o.Upstreams[0].SlowStart, o.Routes[0].MaxRescues; s == nil || *s != 0 || r == nil || *r != 0 {
		t.Fatalf("slow_start %v, max_rescues %v", s, r)
	}
}

// TestServerReduceMemoryReachesTheListener: server.reduce_memory in the
// file turns fasthttp's ReduceMemoryUsage on for the client listener.
func TestServerReduceMemoryReachesTheListener(t *testing.T) {
	t.Parallel()
	p, err := proxy.New(optionsOf(t, "server: {reduce_memory: true}\nupstreams: [{name: a, url: 'http://127.0.0.1:1'}]\nroutes: [{name: r, upstream: a}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Server().ReduceMemoryUsage {
		t.Fatal("server.reduce_memory: true did not reach the listener")
	}
}

// TestServerReduceMemoryAboveReachesTheProxy: server.reduce_memory_above
// in the file is the proxy's threshold for lean connections.
func TestServerReduceMemoryAboveReachesTheProxy(t *testing.T) {
	t.Parallel()
	o := optionsOf(t, "server: {reduce_memory_above: 7}\nupstreams: [{name: a, url: 'http://127.0.0.1:1'}]\nroutes: [{name: r, upstream: a}]\n")
	if n := o.Server.ReduceMemoryAbove; n != 7 {
		t.Fatalf("server.reduce_memory_above: 7 reached the proxy as %d", n)
	}
}

// optionsOf is the proxy's options from a config file holding yaml, read
// as the binary reads it.
func optionsOf(t *testing.T, yaml string) proxy.Options {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sturdy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(settings{configPath: path})
	if err != nil {
		t.Fatal(err)
	}
	return proxyOptions(cfg, zerolog.Nop(), nil)
}

// TestTheAdminAddressComesFromTheFileBeforeTheContainerDefault: with the
// image's STURDY_DEFAULT_ADMIN_LISTEN set, a file's admin.listen (or
// admin_listen) still wins, for the server and for -healthcheck alike,
// and the probe expands ${VAR} in it as the server does.
func TestTheAdminAddressComesFromTheFileBeforeTheContainerDefault(t *testing.T) {
	t.Setenv("STURDY_DEFAULT_ADMIN_LISTEN", ":9090")
	t.Setenv("STURDY_TEST_ADMIN", "127.0.0.1:18491")
	dir := t.TempDir()
	for _, tc := range []struct{ yaml, want string }{
		{"admin: {listen: 127.0.0.1:19090}\n", "127.0.0.1:19090"},
		{"admin_listen: 127.0.0.1:19091\n", "127.0.0.1:19091"},
		{"admin: {listen: \"${STURDY_TEST_ADMIN}\"}\n", "127.0.0.1:18491"},
		{"log: {level: warn}\n", ":9090"},
	} {
		path := filepath.Join(dir, "admin.yaml")
		if err := os.WriteFile(path, []byte(tc.yaml+"upstreams: [{name: a, url: 'http://127.0.0.1:1'}]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig(settings{configPath: path})
		if err != nil {
			t.Fatal(err)
		}
		if probe := adminAddr(settings{configPath: path}); cfg.AdminListen != tc.want || probe != tc.want {
			t.Errorf("%q: the server listens on %q, the probe asks %q; want %q", tc.yaml, cfg.AdminListen, probe, tc.want)
		}
	}
}
