package main

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
)

func TestVersionFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"-version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "sturdy ") || !strings.Contains(out.String(), "go1") {
		t.Fatalf("exit %d, %q", code, out.String())
	}
}

func TestCheckAcceptsTheExampleConfig(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"-check", "-config", "config.example.yaml"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}

func TestCheckRejectsAnInvalidConfigWithKeyAndLine(t *testing.T) {
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

func TestUpstreamFlagWithoutConfig(t *testing.T) {
	cfg, err := loadConfig(settings{upstream: "http://127.0.0.1:9999/base", listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstreams[0].URL != "http://127.0.0.1:9999/base" || cfg.Listen != "127.0.0.1:0" || cfg.Routes[0].PathPrefix != "/" {
		t.Fatalf("%+v", cfg)
	}
	if _, err := loadConfig(settings{upstream: "ftp://nope"}); err == nil {
		t.Fatal("bad -upstream accepted")
	}
}

// TestSIGTERMLetsInFlightStreamsFinish builds the binary, opens a slow
// stream through it, sends SIGTERM, and checks the stream completes, new
// connections are refused and the process exits 0.
func TestSIGTERMLetsInFlightStreamsFinish(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "sturdy")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE("a", "b", "c", "d", "e", "f", "g", "h"), ChunkDelay: 100 * time.Millisecond})
	addr := freeAddr(t)
	cmd := exec.Command(bin, "-upstream", up.URL, "-listen", addr, "-admin-listen", freeAddr(t))
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitListening(t, addr)

	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil { // the stream has started
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("in-flight stream cut by shutdown: err=%v tail=%q", err, rest)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sturdy did not exit after SIGTERM")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("still accepting connections after shutdown")
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
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

func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("sturdy never listened on %s", addr)
}
