package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// idleSettle is how long the idle connections stay open before Sturdy's
// memory is read.
const idleSettle = 2 * time.Second

// idleResult is what the idle measurement found.
type idleResult struct {
	conns            int
	server           string // the server keys set beside max_connections ("": none)
	baseline, loaded int64  // Sturdy's RSS before the connections and with them open
}

// idleSettings are the server keys the idle scenario measures in turn,
// for conns connections: the default (connections past the first 1,000
// served lean), every connection at full speed, every one lean.
func idleSettings(conns int) []string {
	return []string{"", fmt.Sprintf("reduce_memory_above: %d", conns+100), "reduce_memory: true"}
}

// measureIdle opens conns keep-alive client connections to Sturdy, each
// answered once (so it is served, watched for leaving and then idle),
// holds them all open, and reads Sturdy's resident memory; server is
// more server keys (YAML flow-mapping entries).
func measureIdle(bin string, conns int, server string) (idleResult, error) {
	res := idleResult{conns: conns, server: server}
	up, err := serveRaw(func(c net.Conn, _ *http.Request) {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
	})
	if err != nil {
		return res, err
	}
	defer up.Close()
	// Above the default (half the descriptor limit): the connections are
	// the point.
	keys := fmt.Sprintf("max_connections: %d", conns+100)
	if server != "" {
		keys += ", " + server
	}
	sc := &scenario{name: "idle", sturdy: "server: {" + keys + "}\n"}
	addr, pid, stop, err := startSolo(bin, sc, up.Addr())
	if err != nil {
		return res, err
	}
	defer stop()
	time.Sleep(200 * time.Millisecond)
	res.baseline = procMemory(pid, "VmRSS:")
	open := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: sturdy\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"model\":\"m\"}"
	for i := 0; i < conns; i++ {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return res, fmt.Errorf("connection %d: %w", i+1, err)
		}
		open = append(open, c)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			return res, fmt.Errorf("connection %d: %w", i+1, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return res, fmt.Errorf("connection %d: %w", i+1, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return res, fmt.Errorf("connection %d: status %d", i+1, resp.StatusCode)
		}
		_ = c.SetDeadline(time.Time{})
	}
	time.Sleep(idleSettle)
	res.loaded = procMemory(pid, "VmRSS:")
	return res, nil
}

func idleReport(w io.Writer, rs []idleResult) {
	if len(rs) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### idle\n\n%d keep-alive client connections, each answered once, then idle for %s\n\n", rs[0].conns, idleSettle)
	fmt.Fprintln(w, "| server | connections | RSS before MiB | RSS with them open MiB | per connection KiB |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	for _, r := range rs {
		per := 0.0
		if r.conns > 0 {
			per = float64(r.loaded-r.baseline) / float64(r.conns) / 1024
		}
		fmt.Fprintf(w, "| %s | %d | %.1f | %.1f | %.1f |\n", cmp.Or(r.server, "default"), r.conns, float64(r.baseline)/(1<<20), float64(r.loaded)/(1<<20), per)
	}
}
