package proxy

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"sturdy/internal/fakellm"
	"sturdy/internal/upstreamtest"
)

var soakFor = flag.Duration("soak", 3*time.Second, "how long TestSoak runs (e.g. -soak=60s)")

// soakUpstream answers with a deterministic fault mix, by arrival order:
// 5 % 503, 5 % reset before headers, a third of the rest as SSE streams;
// every reply echoes the request id, so cross-talk would show.
func soakUpstream(t *testing.T) string {
	var n atomic.Int64
	srv := &fasthttp.Server{Logger: upstreamtest.Quiet{}, Handler: func(ctx *fasthttp.RequestCtx) {
		i := n.Add(1)
		id := string(ctx.Request.Header.Peek("X-Request-Id"))
		switch {
		case i%20 == 0:
			ctx.SetStatusCode(503)
		case i%20 == 10:
			fakellm.ResetBeforeResponse(ctx)
		case i%3 == 0:
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for k := 0; k < 5; k++ {
					fmt.Fprintf(w, "data: {\"id\":%q,\"k\":%d}\n\n", id, k)
					_ = w.Flush()
					time.Sleep(time.Millisecond)
				}
				fmt.Fprint(w, "data: [DONE]\n\n")
			})
		default:
			ctx.SetContentType("application/json")
			fmt.Fprintf(ctx, `{"id":%q}`, id)
		}
	}}
	return upstreamtest.Serve(t, srv)
}

// busyGoroutines counts goroutines, leaving out fasthttp's idle pooled
// workers: they wait for work by design and expire on their own.
func busyGoroutines() int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "[chan receive") && strings.Contains(g, "fasthttp.(*workerPool)") {
			continue
		}
		n++
	}
	return n
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// soakAlone, set in its environment, makes a test binary the soak's own
// process: TestSoak starts one.
const soakAlone = "STURDY_SOAK_ALONE"

// TestSoak runs steady load with 10 % faults and streams for -soak (3 s by
// default; `go test -run Soak -soak=60s ./proxy` for a real soak) and
// checks every request is answered exactly once with its own reply, and
// that goroutines and heap return to their baseline.
//
// Goroutines, heap and RSS are the process's: the soak runs in a test
// process of its own, so that its figures are not those of the tests
// that ran before it in parallel (under the race detector, a past peak
// of them keeps the RSS up). It is not parallel either: it loads every
// CPU, and others measure time.
func TestSoak(t *testing.T) {
	if os.Getenv(soakAlone) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSoak$", "-test.count=1", "-test.v", "-soak="+soakFor.String())
		cmd.Env = append(os.Environ(), soakAlone+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("the soak's own process:\n%s", out)
		if err != nil || !strings.Contains(string(out), "--- PASS: TestSoak") {
			t.Fatalf("the soak failed (%v)", err)
		}
		return
	}
	upURL := soakUpstream(t)
	h := startProxy(t, upURL, nil)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32, DisableCompression: true}}
	h.chat("") // warm up pools before the baseline
	runtime.GC()
	baseGoroutines, baseHeap := busyGoroutines(), heapInUse()

	const workers = 16
	var sent, ok, failed, wrong atomic.Int64
	var mu sync.Mutex
	seen := map[string]int{}
	deadline := time.Now().Add(*soakFor)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline) && i < 1_000_000; i++ {
				id := fmt.Sprintf("soak-%d-%d", w, i)
				req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
				req.Header.Set("X-Request-Id", id)
				sent.Add(1)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				seen[id]++
				mu.Unlock()
				switch {
				case err != nil || resp.StatusCode != 200:
					failed.Add(1)
				case !bytes.Contains(body, []byte(`"`+id+`"`)):
					wrong.Add(1)
				case resp.Header.Get("Content-Type") == "text/event-stream" && !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")):
					wrong.Add(1)
				default:
					ok.Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	t.Logf("soak %v: %d requests, %d ok, %d failed, %d wrong; RSS %d MiB", *soakFor, sent.Load(), ok.Load(), failed.Load(), wrong.Load(), rssBytes()>>20)
	if wrong.Load() > 0 {
		t.Fatalf("%d replies belonged to another request or were cut", wrong.Load())
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("request %s answered %d times", id, n)
		}
	}
	if f := failed.Load(); f*200 > sent.Load() { // ≤ 0.5 %
		t.Fatalf("%d of %d requests failed despite retries", f, sent.Load())
	}
	// Back to baseline once idle.
	client.CloseIdleConnections()
	h.p.CloseIdleConnections()
	var g int
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if g = busyGoroutines(); g <= baseGoroutines+2 {
			break
		}
	}
	if g > baseGoroutines+2 {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines %d after the soak, baseline %d: a leak\n%s", g, baseGoroutines, buf[:runtime.Stack(buf, true)])
	}
	if heap := heapInUse(); heap > baseHeap+32<<20 {
		t.Fatalf("heap %d MiB after the soak, baseline %d MiB", heap>>20, baseHeap>>20)
	}
	if rss := rssBytes(); rss > 512<<20 {
		t.Fatalf("RSS %d MiB", rss>>20)
	}
}
