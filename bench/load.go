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

// run executes l and returns every request's record.
func (l load) run() []record {
	u, err := url.Parse(l.url)
	if err != nil {
		panic(err)
	}
	client := &fasthttp.HostClient{
		Addr:                      u.Host,
		MaxConns:                  l.workers + 16,
		MaxConnWaitTimeout:        time.Minute,
		MaxIdemponentCallAttempts: 1,
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		StreamResponseBody:        true,
		ReadBufferSize:            64 << 10,
	}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var recs []record
	var sent, done atomic.Int64
	start := time.Now()
	one := func(at time.Duration) {
		r := l.do(client, start, at)
		done.Add(1)
		mu.Lock()
		recs = append(recs, r)
		mu.Unlock()
	}
	stopProgress, progressDone := make(chan struct{}), make(chan struct{})
	if l.progress == nil {
		close(progressDone)
	} else {
		go func() {
			defer close(progressDone)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					l.progress(sent.Load(), done.Load())
				case <-stopProgress:
					return
				}
			}
		}()
	}
	var wg sync.WaitGroup
	if l.rate > 0 {
		interval := time.Duration(float64(time.Second) / l.rate)
		inflight := make(chan struct{}, max(l.workers, 1))
		for i := 0; ; i++ {
			at := time.Duration(i) * interval
			if at >= l.duration {
				break
			}
			if d := time.Until(start.Add(at)); d > 0 {
				time.Sleep(d)
			}
			select {
			case inflight <- struct{}{}:
			default: // over the in-flight cap: counted as a failure at its scheduled time
				mu.Lock()
				recs = append(recs, record{at: at, latency: time.Since(start.Add(at))})
				mu.Unlock()
				continue
			}
			sent.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				one(at)
				<-inflight
			}()
		}
	} else {
		for w := 0; w < l.workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					at := time.Since(start)
					if at >= l.duration {
						return
					}
					sent.Add(1)
					one(at)
					if l.once {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(stopProgress)
	<-progressDone
	sort.Slice(recs, func(i, j int) bool { return recs[i].at < recs[j].at })
	return recs
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
