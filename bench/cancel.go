package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"time"
)

// cancelHold is how long each client of the cancel measurement waits
// for an answer that never comes before it leaves.
const cancelHold = 50 * time.Millisecond

// measureCancel asks, tries times, for a completion from an upstream that
// never answers, and closes the client connection after cancelHold; it
// returns, for each try, how long after the client's close Sturdy closed
// its upstream connection — what makes a model server stop generating.
func measureCancel(bin string, tries int) ([]time.Duration, error) {
	closed := make(chan time.Time, 1)
	up, err := serveRaw(func(c net.Conn, _ *http.Request) {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(io.Discard, c) // until Sturdy closes
		closed <- time.Now()
	})
	if err != nil {
		return nil, err
	}
	defer up.Close()
	addr, _, stop, err := startSolo(bin, &scenario{name: "cancel"}, up.Addr())
	if err != nil {
		return nil, err
	}
	defer stop()
	const request = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	var delays []time.Duration
	for i := 0; i < tries; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		_, _ = io.WriteString(c, request)
		time.Sleep(cancelHold)
		c.Close()
		left := time.Now()
		select {
		case at := <-closed:
			delays = append(delays, at.Sub(left))
		case <-time.After(5 * time.Second):
			return nil, fmt.Errorf("try %d: the upstream connection stayed open 5 s after the client left", i)
		}
	}
	return delays, nil
}

// cancelReport prints the delays' percentiles.
func cancelReport(w io.Writer, delays []time.Duration) {
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	q := func(p float64) float64 {
		return float64(delays[min(len(delays)-1, int(p*float64(len(delays))))]) / float64(time.Millisecond)
	}
	fmt.Fprintf(w, "### cancel\nclient closes %v after sending; time until Sturdy closes the upstream connection\n\n", cancelHold)
	fmt.Fprintf(w, "| tries | p50 ms | p99 ms | max ms |\n|---:|---:|---:|---:|\n| %d | %.2f | %.2f | %.2f |\n\n",
		len(delays), q(0.50), q(0.99), q(1))
}
