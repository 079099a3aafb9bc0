package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
)

// underFDLimit runs the binary with both file descriptor limits at n (Go
// raises the soft limit to the hard one at start, so the hard one counts).
func underFDLimit(n int) func(bin string, args ...string) *exec.Cmd {
	return func(bin string, args ...string) *exec.Cmd {
		return exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, n), bin}, args...)...)
	}
}

// flood opens n connections to addr that send nothing, and returns them.
func flood(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			break // the backlog is full: enough
		}
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// streamThrough starts a slow SSE stream through addr and returns a channel
// with its error (nil when it ended with [DONE]).
func streamThrough(addr string) <-chan error {
	done := make(chan error, 1)
	go func() {
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			err = fmt.Errorf("stream cut: %q", b)
		}
		done <- err
	}()
	return done
}

// TestFileDescriptorFloodRefusesPolitely floods a binary limited to 256
// file descriptors with 400 silent connections: past server.max_connections
// (by default half the limit) they are answered 503 too_many_connections,
// a stream in flight completes, and once the flood ends Sturdy serves again.
func TestFileDescriptorFloodRefusesPolitely(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE("a", "b", "c", "d", "e", "f", "g", "h"), ChunkDelay: 150 * time.Millisecond})
	p := runBinaryCmd(t, underFDLimit(256), func(listen, admin string) []string {
		return []string{"-upstream", up.URL, "-listen", listen, "-admin-listen", admin}
	})
	stream := streamThrough(p.addr)
	time.Sleep(100 * time.Millisecond)
	conns := flood(t, p.addr, 400)
	// The cap is (256 - 128) / 2 = 64: the next ones are answered (a few at
	// a time; past that they are closed at once, a flood costs no more).
	past := conns[110]
	_ = past.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(past), nil)
	if err != nil {
		t.Fatalf("a connection past the cap got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || !strings.Contains(string(body), `"too_many_connections"`) {
		t.Fatalf("past the cap: %d %s", resp.StatusCode, body)
	}
	if err := <-stream; err != nil {
		t.Fatalf("stream in flight during the flood: %v", err)
	}
	servesAgain(t, p, conns)
}

// TestFileDescriptorExhaustionDoesNotStopTheProcess raises
// server.max_connections above the file descriptor limit, so accept runs
// out of descriptors: Sturdy retries, keeps its stream, and serves again.
func TestFileDescriptorExhaustionDoesNotStopTheProcess(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE("a", "b", "c", "d", "e", "f", "g", "h"), ChunkDelay: 150 * time.Millisecond})
	cfg := filepath.Join(t.TempDir(), "sturdy.yaml")
	yaml := fmt.Sprintf("server: {max_connections: 100000}\nupstreams: [{name: up, url: %q}]\n", up.URL)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := runBinaryCmd(t, underFDLimit(128), func(listen, admin string) []string {
		return []string{"-config", cfg, "-listen", listen, "-admin-listen", admin}
	})
	stream := streamThrough(p.addr)
	time.Sleep(100 * time.Millisecond)
	conns := flood(t, p.addr, 300)
	if err := <-stream; err != nil {
		t.Fatalf("stream in flight while descriptors ran out: %v", err)
	}
	servesAgain(t, p, conns)
	if !strings.Contains(p.logs.String(), "accepting connections fails") {
		t.Fatalf("descriptors never ran out, the test proves nothing:\n%s", p.logs.String())
	}
}

// servesAgain closes the flood and checks the process lives and answers.
func servesAgain(t *testing.T, p *sturdyProc, conns []net.Conn) {
	t.Helper()
	for _, c := range conns {
		c.Close()
	}
	select {
	case <-p.exited:
		t.Fatalf("sturdy exited (%v):\n%s", p.err, p.logs.String())
	default:
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Post("http://"+p.addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not serving again after the flood: %v\n%s", err, p.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// underMemoryLimit runs the binary with its address space limited to
// 2 GiB, so a process that allocates what a hostile peer announces dies
// at once instead of taking the machine's memory.
func underMemoryLimit(bin string, args ...string) *exec.Cmd {
	return exec.Command("sh", append([]string{"-c", `ulimit -v 2097152 && exec "$0" "$@"`, bin}, args...)...)
}

// hostileRedis answers whatever it is sent with a reply that announces
// two billion elements.
func hostileRedis(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					if _, err := c.Write([]byte("*2000000000\r\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "redis://" + ln.Addr().String() + "/0"
}

// TestAHostileRedisNeitherBlocksStartNorGrowsMemory: with shared_state
// on a Redis that answers `*2000000000`, Sturdy (under a 2 GiB address
// space limit) listens at once, serves with its own state (on_failure:
// local), and stays small. Before, it never listened: it subscribed
// synchronously without a deadline while go-redis allocated what the
// reply announced (3.7 → 14.3 GB).
func TestAHostileRedisNeitherBlocksStartNorGrowsMemory(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader}, Body: upstreamtest.ChatCompletion("ok")})
	cfg := filepath.Join(t.TempDir(), "sturdy.yaml")
	yaml := fmt.Sprintf("shared_state: {redis_url: %q, timeout: 100ms}\nupstreams: [{name: up, url: %q, rate_limit: {requests_per_second: 100}}]\n",
		hostileRedis(t), up.URL)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := runBinaryCmd(t, underMemoryLimit, func(listen, admin string) []string {
		return []string{"-config", cfg, "-listen", listen, "-admin-listen", admin}
	})
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("listening took %v", d)
	}
	for i := 0; i < 5; i++ { // each asks the hostile Redis to pace it, then carries on alone
		resp, err := http.Post("http://"+p.addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatalf("request %d: %v\n%s", i, err, p.logs.String())
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d\n%s", i, resp.StatusCode, p.logs.String())
		}
	}
	select {
	case <-p.exited:
		t.Fatalf("sturdy died (%v):\n%s", p.err, p.logs.String())
	default:
	}
	if rss := rssOf(t, p.cmd.Process.Pid); rss > 512<<20 {
		t.Fatalf("RSS %d MiB with a hostile Redis", rss>>20)
	}
}

// rssOf reads a process's resident set size from /proc.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
