package main

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// The fake GPU server's model (the overload scenarios): a reply starts
// gpuBase after it gets a slot, plus gpuPerPromptToken per prompt token
// (a body's bytes ÷ 4); each output token takes gpuPerToken · (1 +
// active ÷ slots) — a batch slows as it fills.
const (
	gpuBase           = 20 * time.Millisecond
	gpuPerPromptToken = 50 * time.Microsecond
	gpuPerToken       = time.Millisecond
)

// gpuServer is a model server with slots parallel places and a FIFO
// queue inside that never refuses (vLLM, Ollama under load: no error,
// only waiting). Replies stream outMin–outMax tokens, uniformly.
type gpuServer struct {
	mu sync.Mutex
	gpuShape
	active int
	queue  []chan struct{}
	rnd    *rand.Rand
	// ttfts are the replies' times to first content from their arrival
	// (what a request the proxy admitted waits), with when they came.
	ttfts  []timedValue
	start  time.Time
	errors atomic.Int64
	ln     net.Listener
	srv    *http.Server
}

// gpuShape is what a fake GPU server is: its slots, and its replies'
// lengths in tokens (outMin–outMax).
type gpuShape struct {
	slots, outMin, outMax int
}

// timedValue is a value at a time from a run's start.
type timedValue struct {
	at time.Duration
	v  float64
}

func startGPU(shape gpuShape) (*gpuServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &gpuServer{gpuShape: shape, rnd: rand.New(rand.NewPCG(7, 8)), ln: ln, start: time.Now()}
	g.srv = &http.Server{Handler: http.HandlerFunc(g.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = g.srv.Serve(ln) }()
	return g, nil
}

func (g *gpuServer) url() string { return "http://" + g.ln.Addr().String() }

func (g *gpuServer) close() { _ = g.srv.Close() }

// set changes the server's slots and output lengths mid-run.
func (g *gpuServer) set(shape gpuShape) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gpuShape = shape
	g.grant()
}

// grant gives free slots to the queue's first; under mu.
func (g *gpuServer) grant() {
	for g.active < g.slots && len(g.queue) > 0 {
		g.active++
		close(g.queue[0])
		g.queue = g.queue[1:]
	}
}

// take waits for a slot and returns the reply's length in tokens.
func (g *gpuServer) take() (tokens int) {
	g.mu.Lock()
	tokens = g.outMin + g.rnd.IntN(g.outMax-g.outMin+1)
	if g.active < g.slots && len(g.queue) == 0 {
		g.active++
		g.mu.Unlock()
		return tokens
	}
	ch := make(chan struct{})
	g.queue = append(g.queue, ch)
	g.mu.Unlock()
	<-ch
	return tokens
}

func (g *gpuServer) put() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active--
	g.grant()
}

// pace is one output token's time now.
func (g *gpuServer) pace() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return time.Duration(float64(gpuPerToken) * (1 + float64(g.active)/float64(max(g.slots, 1))))
}

func (g *gpuServer) serve(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		g.errors.Add(1)
		return
	}
	tokens := g.take()
	defer g.put()
	time.Sleep(gpuBase + time.Duration(len(body)/4)*gpuPerPromptToken)
	w.Header().Set("Content-Type", "text/event-stream")
	bw := bufio.NewWriter(w)
	f, _ := w.(http.Flusher)
	for i := range tokens {
		fmt.Fprintf(bw, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"},\"finish_reason\":null}]}\n\n", i)
		if bw.Flush() != nil {
			return
		}
		if f != nil {
			f.Flush()
		}
		if i == 0 {
			g.mu.Lock()
			g.ttfts = append(g.ttfts, timedValue{at: arrived.Sub(g.start), v: millis(time.Since(arrived))})
			g.mu.Unlock()
		}
		time.Sleep(g.pace())
	}
	fmt.Fprint(bw, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	_ = bw.Flush()
}

// serverTTFTs returns the replies' times to first content (ms) that
// arrived between from and to of the run.
func (g *gpuServer) serverTTFTs(from, to time.Duration) []float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []float64
	for _, t := range g.ttfts {
		if t.at >= from && t.at < to {
			out = append(out, t.v)
		}
	}
	return out
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pctl is the q-th percentile (0–100) of vs (sorted here), 0 for none.
func pctl(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	sort.Float64s(vs)
	return vs[min(len(vs)-1, int(q/100*float64(len(vs))))]
}
