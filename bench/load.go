package main

import (
	"bytes"
	"io"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/valyala/fasthttp"
)

// record is one request as the load generator saw it. Times are from the
// request's *scheduled* start, so a slow server cannot hide its latency
// by delaying the next request (no coordinated omission).
type record struct {
	at       time.Duration // scheduled start, from the run's start
	latency  time.Duration // to the last body byte
	ttft     time.Duration // to the first body byte
	gap      time.Duration // mean gap between body reads (streams)
	status   int           // 0: transport error
	fastFail bool          // Sturdy answered circuit_open
}

// load describes how a run sends requests.
type load struct {
	url      string
	body     []byte
	rate     float64       // open loop: requests per second (0: closed loop)
	workers  int           // closed loop: concurrent clients; open loop: max in flight
	duration time.Duration // how long requests are started
	once     bool          // closed loop: each worker sends one request
	progress func(sent, done int64)
}

// runner is one execution of a load: its client and what it recorded.
type runner struct {
	l          load
	client     *fasthttp.HostClient
	start      time.Time
	mu         sync.Mutex
	recs       []record
	sent, done atomic.Int64
	wg         sync.WaitGroup
}

// run executes l and returns every request's record.
func (l load) run() []record {
	u, err := url.Parse(l.url)
	if err != nil {
		panic(err)
	}
	r := &runner{l: l, client: &fasthttp.HostClient{
		Addr:                      u.Host,
		MaxConns:                  l.workers + 16,
		MaxConnWaitTimeout:        time.Minute,
		MaxIdemponentCallAttempts: 1,
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		StreamResponseBody:        true,
		ReadBufferSize:            64 << 10,
	}}
	defer r.client.CloseIdleConnections()
	r.start = time.Now()
	stopProgress := r.reportProgress()
	if l.rate > 0 {
		r.openLoop()
	} else {
		r.closedLoop()
	}
	r.wg.Wait()
	stopProgress()
	sort.Slice(r.recs, func(i, j int) bool { return r.recs[i].at < r.recs[j].at })
	return r.recs
}

// one sends the request scheduled at at and records it.
func (r *runner) one(at time.Duration) {
	rec := r.l.do(r.client, r.start, at)
	r.done.Add(1)
	r.add(rec)
}

func (r *runner) add(rec record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

// openLoop starts requests at the load's constant rate; one over the
// in-flight cap counts as a failure at its scheduled time.
func (r *runner) openLoop() {
	interval := time.Duration(float64(time.Second) / r.l.rate)
	inflight := make(chan struct{}, max(r.l.workers, 1))
	for i := 0; ; i++ {
		at := time.Duration(i) * interval
		if at >= r.l.duration {
			return
		}
		if d := time.Until(r.start.Add(at)); d > 0 {
			time.Sleep(d)
		}
		select {
		case inflight <- struct{}{}:
		default:
			r.add(record{at: at, latency: time.Since(r.start.Add(at))})
			continue
		}
		r.sent.Add(1)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.one(at)
			<-inflight
		}()
	}
}

// closedLoop runs the load's workers, each sending its next request when
// the last one ended (or only one, with once).
func (r *runner) closedLoop() {
	for w := 0; w < r.l.workers; w++ {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for {
				at := time.Since(r.start)
				if at >= r.l.duration {
					return
				}
				r.sent.Add(1)
				r.one(at)
				if r.l.once {
					return
				}
			}
		}()
	}
}

// reportProgress calls the load's progress func every second until the
// returned stop is called.
func (r *runner) reportProgress() (stop func()) {
	if r.l.progress == nil {
		return func() {}
	}
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				r.l.progress(r.sent.Load(), r.done.Load())
			case <-quit:
				return
			}
		}
	}()
	return func() { close(quit); <-exited }
}

var circuitOpen = []byte(`"code":"circuit_open"`)

// do sends one request scheduled at start+at and reads its whole body.
func (l load) do(client *fasthttp.HostClient, start time.Time, at time.Duration) record {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(l.url)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.Header.Set("X-Request-Id", "bench-"+strconv.FormatInt(int64(at), 36)+"-"+strconv.FormatInt(time.Now().UnixNano()%1e9, 36))
	req.SetBodyRaw(l.body)
	scheduled := start.Add(at)
	r := record{at: at}
	if err := client.DoTimeout(req, resp, 2*time.Minute); err != nil {
		r.latency = time.Since(scheduled)
		return r
	}
	r.status = resp.StatusCode()
	body := resp.BodyStream()
	buf := make([]byte, 32<<10)
	var head []byte
	reads := 0
	var first, last time.Time
	for body != nil {
		n, err := body.Read(buf)
		if n > 0 {
			now := time.Now()
			if reads == 0 {
				first = now
				head = append(head, buf[:min(n, 512)]...)
			}
			last = now
			reads++
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			r.status = 0 // a cut body is a failure, whatever the status said
			break
		}
	}
	_ = resp.CloseBodyStream()
	end := time.Now()
	r.latency = end.Sub(scheduled)
	if first.IsZero() {
		first = end
	}
	r.ttft = first.Sub(scheduled)
	if reads > 1 {
		r.gap = last.Sub(first) / time.Duration(reads-1)
	}
	r.fastFail = r.status == 503 && bytes.Contains(head, circuitOpen)
	return r
}

// latencies builds an HDR histogram (microseconds) of the records that
// pass keep, measured by pick.
func latencies(recs []record, keep func(record) bool, pick func(record) time.Duration) *hdrhistogram.Histogram {
	h := hdrhistogram.New(1, int64(10*time.Minute/time.Microsecond), 3)
	for _, r := range recs {
		if keep(r) {
			_ = h.RecordValue(max(int64(pick(r)/time.Microsecond), 1))
		}
	}
	return h
}

func all(record) bool                  { return true }
func ok(r record) bool                 { return r.status >= 200 && r.status < 300 }
func total(r record) time.Duration     { return r.latency }
func firstByte(r record) time.Duration { return r.ttft }
func ms(h *hdrhistogram.Histogram, q float64) float64 {
	return float64(h.ValueAtQuantile(q)) / 1000
}
