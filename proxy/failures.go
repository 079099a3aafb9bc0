package proxy

import (
	"strings"
	"sync"
	"time"
)

// MaxListedFailures is how many failed requests Failures keeps: the
// newest, in a fixed ring.
const MaxListedFailures = 50

// maxFailurePath bounds the path a listed failure keeps (a request's path
// may be as long as its header limit).
const maxFailurePath = 256

// FailedRequest is one request that failed for a reason Sturdy or its
// upstreams own (see failed: a client's own mistakes, its own limit and
// its leaving do not push the others out), as
// the status page and /debug/failures show it: the access line's fields
// and nothing else — no header value but the request id, no body, no
// query.
type FailedRequest struct {
	Time     time.Time `json:"time"`
	ID       string    `json:"id"`
	Method   string    `json:"method"`
	Path     string    `json:"path"`
	Route    string    `json:"route,omitempty"`
	Upstream string    `json:"upstream,omitempty"`
	Endpoint string    `json:"endpoint,omitempty"`
	Status   int       `json:"status"`
	Outcome  string    `json:"outcome"`
	Error    string    `json:"error,omitempty"`
	// Stop is why the attempts stopped; Cause what a breaker or a
	// connection failure said.
	Stop     string `json:"stop,omitempty"`
	Cause    string `json:"cause,omitempty"`
	Attempts int    `json:"attempts"`
	// Targets and Retries are the decision trail: each target with its
	// attempts and how the last ended, each retry with its reason.
	Targets       []FailedTarget `json:"targets,omitempty"`
	Retries       []FailedRetry  `json:"retries,omitempty"`
	Stream        bool           `json:"stream"`
	RescueRefused string         `json:"rescue_refused,omitempty"`
	DurationMS    float64        `json:"duration_ms"`
}

// FailedTarget is one target of a failed request.
type FailedTarget struct {
	Upstream string `json:"upstream"`
	Model    string `json:"model,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	Attempts int    `json:"attempts"`
	Result   string `json:"result"`
	Breaker  string `json:"breaker,omitempty"`
}

// FailedRetry is one retry of a failed request.
type FailedRetry struct {
	Reason   string  `json:"reason"`
	Endpoint string  `json:"endpoint,omitempty"`
	WaitMS   float64 `json:"wait_ms"`
}

// failureRing holds the newest MaxListedFailures failed requests.
type failureRing struct {
	mu   sync.Mutex
	buf  [MaxListedFailures]FailedRequest
	next int
	n    int
}

// failed says whether a finished request is listed: not a success, not
// the client's own mistake (pass_through, rejected, unauthorized), not a
// client that left, and not a client over its own clients: limit — a 429
// answered at admission, before the request was routed (a target's
// cooldown or pacing refuses a routed one).
func failed(s *summary) bool {
	switch s.outcome {
	case outcomeOK, outcomePassThrough, outcomeRejected, outcomeUnauthorized, outcomeClientGone:
		return false
	case outcomeRateLimited:
		return s.rt != nil
	}
	return true
}

// record lists a finished request when it failed. The summary's strings
// alias the exchange, so everything kept is copied.
func (r *failureRing) record(s *summary) {
	if !failed(s) {
		return
	}
	path := s.path
	if len(path) > maxFailurePath {
		path = path[:maxFailurePath]
	}
	c := strings.Clone
	f := FailedRequest{Time: time.Now(), ID: string(s.id), Method: string(s.method), Path: string(path),
		Route: c(s.route), Upstream: c(s.upstream), Endpoint: c(s.endpoint), Status: s.status, Outcome: s.outcome,
		Error: c(s.errCode), Cause: c(s.cause), Attempts: s.attempts, Stream: s.streaming, RescueRefused: c(s.refused),
		DurationMS: float64(s.dur) / float64(time.Millisecond)}
	if s.stop.Ended() {
		f.Stop = s.stop.String()
	}
	for _, t := range s.targets {
		f.Targets = append(f.Targets, FailedTarget{Upstream: c(t.upstream), Model: c(t.model), Endpoint: c(t.endpoint),
			Attempts: t.attempts, Result: c(t.result), Breaker: c(t.breaker)})
	}
	for _, rt := range s.retries {
		f.Retries = append(f.Retries, FailedRetry{Reason: rt.reason.String(), Endpoint: c(rt.endpoint),
			WaitMS: float64(rt.wait) / float64(time.Millisecond)})
	}
	r.mu.Lock()
	r.buf[r.next] = f
	r.next = (r.next + 1) % MaxListedFailures
	r.n = min(r.n+1, MaxListedFailures)
	r.mu.Unlock()
}

// list lists the ring's failed requests, newest first (see
// Proxy.Failures).
func (r *failureRing) list() []FailedRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]FailedRequest, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.buf[(r.next-i+MaxListedFailures)%MaxListedFailures])
	}
	return out
}
