// Package redistest runs a real redis-server for tests: on 127.0.0.1, a
// free port, no persistence, stopped when the test ends. Only tests
// built with the external tag use it; without redis-server installed such
// a test fails, naming the install command (package testdeps; .ci/run
// installs it).
package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"sturdy/internal/testdeps"
)

// Server is a running redis-server.
type Server struct {
	// Addr is 127.0.0.1:port; URL is redis://Addr/0.
	Addr, URL string
	t         testing.TB
	port      int
	cmd       *exec.Cmd
}

// Start runs a redis-server until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := testdeps.Binary(t, "redis-server", "apt-get install -y redis-server")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), t: t, port: port}
	s.URL = "redis://" + s.Addr + "/0"
	s.start(bin)
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) start(bin string) {
	s.t.Helper()
	s.cmd = exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(s.port), "--save", "", "--appendonly", "no",
		"--protected-mode", "yes")
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
	}
	s.t.Fatalf("redis-server did not listen on %s", s.Addr)
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart starts the server again on the same port, empty.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	bin, _ := exec.LookPath("redis-server")
	s.start(bin)
}

// ScriptCalls is how many scripts the server has run (EVALSHA and EVAL
// calls, from INFO commandstats): what a shared limit's requests cost it.
func (s *Server) ScriptCalls() int64 {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: 2})
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		s.t.Fatal(err)
	}
	var n int64
	for _, m := range scriptStat.FindAllStringSubmatch(info, -1) {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		n += v
	}
	return n
}

var scriptStat = regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`)
