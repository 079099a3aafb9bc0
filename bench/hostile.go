package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The hostile scenario attacks one running Sturdy with what a client or
// an upstream controls — an endless rescuable stream, huge distinct model
// names, a flood of distinct client keys, a request that loops back —
// while another client sends it small requests, and reports Sturdy's
// peak resident memory and that client's p99 in each attack. tries
// scales the attacks: tries models of 4 MiB, 1,000 × tries keys, a
// stream of 2 × tries MiB.

// hostileAttack is one attack's outcome.
type hostileAttack struct {
	name, what string
	peakRSS    int64
	otherP99   time.Duration
	result     string
}

// hostileModelBytes is each huge model name's size.
const hostileModelBytes = 4 << 20

func measureHostile(bin string, tries int) ([]hostileAttack, error) {
	fast, err := serveRaw(func(c net.Conn, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
	})
	if err != nil {
		return nil, err
	}
	defer fast.Close()
	streamBytes := int64(tries) << 21
	endless, err := serveRaw(func(c net.Conn, _ *http.Request) { endlessStream(c, streamBytes) })
	if err != nil {
		return nil, err
	}
	defer endless.Close()
	// The loop goes through a relay to Sturdy's own listener: -check
	// refuses an upstream at the listen address itself.
	relay, target, err := relayTo()
	if err != nil {
		return nil, err
	}
	defer relay.Close()
	sc := &scenario{name: "hostile", sturdy: fmt.Sprintf(`  - name: endless
    url: http://%s
    continuation: prefill
  - name: loop
    url: http://%s
clients: [{key_header: Authorization, requests_per_second: 100}]
routes:
  - {name: rescue, path_prefix: /rescue/, upstream: endless}
  - {name: loop, path_prefix: /loop/, upstream: loop, retry: {max_attempts: 1}}
  - {name: default, path_prefix: /, upstream: fake, max_body: 8MiB}
`, endless.Addr(), relay.Addr())}
	addr, pid, stop, err := startSolo(bin, sc, fast.Addr())
	if err != nil {
		return nil, err
	}
	defer stop()
	target.Store(&addr)
	url := "http://" + addr
	var out []hostileAttack
	for _, at := range hostileAttacks(url, tries, streamBytes) {
		other := startOtherClient(url)
		peak := &atomic.Int64{}
		done := watchRSS(pid, peak)
		result := at.attack()
		done()
		out = append(out, hostileAttack{name: at.name, what: at.what, peakRSS: peak.Load(), otherP99: other(), result: result})
	}
	return out, nil
}

// hostileAttacks are the attacks measureHostile makes, in turn, on the
// Sturdy at url (tries scales them; the rescuable stream is streamBytes).
func hostileAttacks(url string, tries int, streamBytes int64) []struct {
	name, what string
	attack     func() string
} {
	return []struct {
		name, what string
		attack     func() string
	}{
		{"N1", fmt.Sprintf("one rescuable chat stream of %d MiB, no end", streamBytes>>20), func() string {
			resp, err := http.Post(url+"/rescue/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"go on"}]}`))
			if err != nil {
				return err.Error()
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return fmt.Sprintf("%d, %d MiB relayed", resp.StatusCode, n>>20)
		}},
		{"N2", fmt.Sprintf("%d requests with distinct %d MiB models", tries, hostileModelBytes>>20), func() string {
			model := strings.Repeat("m", hostileModelBytes)
			codes := map[int]int{}
			for i := 0; i < tries; i++ {
				body := fmt.Sprintf(`{"model":"%d%s","messages":[{"role":"user","content":"hi"}]}`, i, model)
				if resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body)); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					codes[resp.StatusCode]++
				}
			}
			return fmt.Sprintf("statuses %v", codes)
		}},
		{"N4", fmt.Sprintf("%d requests with distinct client keys", 1000*tries), func() string {
			rate := distinctKeys(url, 1000*tries)
			return fmt.Sprintf("first tenth %.0f req/s, last tenth %.0f req/s", rate[0], rate[1])
		}},
		{"N6", "one request whose upstream is Sturdy itself (through a relay)", func() string {
			start := time.Now()
			resp, err := http.Post(url+"/loop/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
			if err != nil {
				return err.Error()
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return fmt.Sprintf("%d in %.1f ms", resp.StatusCode, float64(time.Since(start))/float64(time.Millisecond))
		}},
	}
}

// endlessStream writes a chat completions stream of 4 KiB words until
// limit bytes went, then closes the connection mid-body (no last chunk,
// no [DONE]): a cut a rescue would continue.
func endlessStream(c net.Conn, limit int64) {
	w := bufio.NewWriterSize(c, 64<<10)
	fmt.Fprint(w, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	event := `data: {"id":"chatcmpl-endless","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` +
		strings.Repeat("w", 4<<10) + `"},"finish_reason":null}]}` + "\n\n"
	for sent := int64(0); sent < limit; sent += int64(len(event)) {
		if _, err := fmt.Fprintf(w, "%x\r\n%s\r\n", len(event), event); err != nil {
			return
		}
	}
	_ = w.Flush() // and the connection closes without the last chunk: a cut
}

// relayTo listens on a free port and relays each connection to the
// address target holds (set once Sturdy's is known).
func relayTo() (net.Listener, *atomic.Pointer[string], error) {
	target := &atomic.Pointer[string]{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				to := target.Load()
				if to == nil {
					return
				}
				up, err := net.DialTimeout("tcp", *to, time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c) }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return ln, target, nil
}

// startOtherClient sends small requests (its own key) every 20 ms until
// the returned func is called, which gives their p99.
func startOtherClient(url string) (p99 func() time.Duration) {
	stop := make(chan struct{})
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		client := &http.Client{Timeout: 30 * time.Second}
		for t := time.NewTicker(20 * time.Millisecond); ; {
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
			req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Authorization", "Bearer the-other-client")
			start := time.Now()
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			mu.Lock()
			lat = append(lat, time.Since(start))
			mu.Unlock()
		}
	}()
	return func() time.Duration {
		close(stop)
		wg.Wait()
		if len(lat) == 0 {
			return 0
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return lat[min(len(lat)-1, len(lat)*99/100)]
	}
}

// watchRSS samples pid's resident memory every 20 ms into peak until the
// returned func is called.
func watchRSS(pid int, peak *atomic.Int64) (done func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if rss := procMemory(pid, "VmRSS:"); rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() { close(stop); wg.Wait() }
}

// distinctKeys sends n requests, each with its own Authorization, over 16
// connections, and returns the rate of the first and the last tenth.
func distinctKeys(url string, n int) [2]float64 {
	var next atomic.Int64
	done := make([]time.Time, n)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
				req.Header.Set("Authorization", fmt.Sprintf("Bearer key-%d", i))
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				done[i] = time.Now()
			}
		}()
	}
	wg.Wait()
	sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })
	tenth := max(n/10, 1)
	rate := func(from, to time.Time) float64 { return float64(tenth) / max(to.Sub(from).Seconds(), 1e-9) }
	return [2]float64{rate(start, done[tenth-1]), rate(done[n-tenth-1], done[n-1])}
}

func hostileReport(w io.Writer, attacks []hostileAttack) {
	fmt.Fprintln(w, "### hostile")
	fmt.Fprintln(w, "\nOne Sturdy under each attack in turn, another client sending it a small request every 20 ms.")
	fmt.Fprintln(w, "\n| attack | what | Sturdy peak RSS so far MiB | other client p99 ms | result |\n|---|---|---:|---:|---|")
	for _, a := range attacks {
		fmt.Fprintf(w, "| %s | %s | %.1f | %s | %s |\n", a.name, a.what, float64(a.peakRSS)/(1<<20),
			orDash(float64(a.otherP99)/float64(time.Millisecond)), a.result)
	}
	fmt.Fprintln(w)
}
