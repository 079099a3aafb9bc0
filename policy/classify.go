package policy

// Fault is what went wrong on the transport of one attempt, when nothing
// usable came back. FaultNone means the upstream answered with a status.
type Fault uint8

// The faults an attempt can end with.
const (
	// FaultNone: the upstream sent response headers (and, where required,
	// its first body bytes).
	FaultNone Fault = iota
	// FaultConnect: dialling the upstream failed (refused, dial timeout,
	// TLS handshake): the request provably never left Sturdy.
	FaultConnect
	// FaultReset: the connection closed or reset before the response
	// started; the upstream may or may not have seen the request.
	FaultReset
	// FaultTimeout: no first byte within the upstream's first_byte timeout.
	FaultTimeout
	// FaultClientGone: the client went away; nobody is left to answer.
	FaultClientGone
	// FaultStale: the connection closed before one byte came back, on a
	// pooled keep-alive connection that had already carried a request:
	// most likely the upstream closed it while it was idle and never saw
	// this request (though a server that reads a request and then resets
	// looks the same).
	FaultStale
	// FaultLocal: Sturdy itself could not open a connection (it is out of
	// file descriptors): the request never left, and the upstream is not
	// to blame.
	FaultLocal
)

// String returns the fault's name as used in config (`retry.on`) and logs.
func (f Fault) String() string {
	switch f {
	case FaultConnect:
		return "connect"
	case FaultReset:
		return "reset"
	case FaultTimeout:
		return "timeout"
	case FaultClientGone:
		return "client_gone"
	case FaultStale:
		return "stale"
	case FaultLocal:
		return "local"
	default:
		return "none"
	}
}

// Outcome is everything Classify needs to know about one attempt.
type Outcome struct {
	// Status is the upstream's HTTP status; it is ignored unless Fault is
	// FaultNone.
	Status int
	// Fault is the transport failure, FaultNone when a status came back.
	Fault Fault
	// InsufficientQuota is true for a 429 whose body says the account's
	// billing quota is exhausted (OpenAI's "insufficient_quota").
	InsufficientQuota bool
	// StreamFailed is true when a streamed reply failed in-band before
	// its commit point (an error event); StreamError is the error's code
	// (see EventFailure).
	StreamFailed bool
	StreamError  string
}

// Class is what an outcome means for the request.
type Class uint8

// The classes of outcome.
const (
	// ClassSuccess: 2xx/3xx, stream it to the client.
	ClassSuccess Class = iota
	// ClassPassThrough: the client asked wrong (4xx other than 429, or a
	// 429 insufficient_quota); return the reply untouched, never retry.
	ClassPassThrough
	// ClassRetryable: a passing fault of the model server (429, 5xx,
	// connect, reset, timeout); retry per policy.
	ClassRetryable
	// ClassClientGone: stop, no retry, no breaker count.
	ClassClientGone
)

// String returns the class name used in logs.
func (c Class) String() string {
	switch c {
	case ClassSuccess:
		return "success"
	case ClassPassThrough:
		return "pass_through"
	case ClassRetryable:
		return "retryable"
	default:
		return "client_gone"
	}
}

// Reason names why a retryable outcome is retryable; it is the vocabulary of
// the route's `retry.on` list and of the access log's retry reasons.
type Reason uint8

// The retry reasons.
const (
	ReasonNone Reason = iota
	Reason429
	Reason5xx
	ReasonConnect
	ReasonReset
	ReasonTimeout
	// ReasonStale: a stale keep-alive connection (FaultStale). It is not
	// a `retry.on` reason: see Retry.Decide for how it is replayed.
	ReasonStale
)

// String returns the reason as written in `retry.on`.
func (r Reason) String() string {
	switch r {
	case Reason429:
		return "429"
	case Reason5xx:
		return "5xx"
	case ReasonConnect:
		return "connect"
	case ReasonReset:
		return "reset"
	case ReasonTimeout:
		return "timeout"
	case ReasonStale:
		return "stale"
	default:
		return ""
	}
}

// Health is what an outcome tells the upstream's circuit breaker.
type Health uint8

// The breaker verdicts.
const (
	// HealthSuccess: the upstream works (2xx/3xx, pass-through 4xx).
	HealthSuccess Health = iota
	// HealthFailure: the upstream is failing (5xx, connect, reset, timeout).
	HealthFailure
	// HealthUnreachable: a failure where nothing answered the connection
	// (connect): most often a server not up yet, probed again soon.
	HealthUnreachable
	// HealthExcluded: says nothing about the upstream's health (429,
	// client gone, a stale pooled connection); neither counts nor resets a
	// run of failures.
	HealthExcluded
)

// Verdict is the classification of one attempt.
type Verdict struct {
	Class  Class
	Reason Reason // set when Class is ClassRetryable
	// Health is what the outcome tells the reply breaker of the upstream
	// and model (replies and timeouts after the request was sent); Conn
	// what it tells the upstream's connection breaker (connect refused,
	// reset before any response, TLS).
	Health Health
	Conn   Health
}

// overloadStatus reports whether a reply's status says the server is
// overloaded: 503, or Anthropic's 529.
func overloadStatus(status int) bool { return status == 503 || status == 529 }

// overloadReply: a reply that says the server is overloaded — its status,
// or an error event before its first content (vLLM's engine at code 503,
// Anthropic's overloaded_error), which comes with a 200.
func overloadReply(o Outcome) bool {
	return overloadStatus(o.Status) ||
		o.StreamFailed && (o.StreamError == "503" || o.StreamError == "529" || o.StreamError == "overloaded_error")
}

// Overloaded reports whether outcome o says the endpoint is overloaded —
// a 503/529 (or an error event saying so before the stream's first
// content), a failed connection, or a timeout of the endpoint's own
// bound (first_byte, first_token; ownTimeout false: the request's
// deadline ran out, and a client's short deadline must not throttle
// every tenant) — but never a 429, which says the quota is spent, not
// the server: an adaptive concurrency limit backs off on it.
func Overloaded(o Outcome, ownTimeout bool) bool {
	switch o.Fault {
	case FaultNone:
		return overloadReply(o)
	case FaultConnect:
		return true
	case FaultTimeout:
		return ownTimeout
	}
	return false
}

// ReplyHealth is what v, the verdict on o, tells the endpoint's reply
// breaker; adaptive says the endpoint's concurrency limit is adaptive:
// then a 503/529 reply feeds the limit (Overloaded) instead of the
// breaker, so one overload does not open the breaker and hide the
// recovery.
func (v Verdict) ReplyHealth(o Outcome, adaptive bool) Health {
	if adaptive && o.Fault == FaultNone && overloadReply(o) {
		return HealthExcluded
	}
	return v.Health
}

// Classify maps an attempt's outcome to what Sturdy does with it. It is the
// classification table of docs/failures-and-retries.md, in code.
func Classify(o Outcome) Verdict {
	switch o.Fault {
	case FaultConnect:
		return Verdict{Class: ClassRetryable, Reason: ReasonConnect, Health: HealthExcluded, Conn: HealthUnreachable}
	case FaultReset:
		return Verdict{Class: ClassRetryable, Reason: ReasonReset, Health: HealthExcluded, Conn: HealthFailure}
	case FaultTimeout:
		return Verdict{Class: ClassRetryable, Reason: ReasonTimeout, Health: HealthFailure, Conn: HealthExcluded}
	case FaultClientGone:
		return Verdict{Class: ClassClientGone, Health: HealthExcluded, Conn: HealthExcluded}
	case FaultStale:
		return Verdict{Class: ClassRetryable, Reason: ReasonStale, Health: HealthExcluded, Conn: HealthExcluded}
	case FaultLocal:
		return Verdict{Class: ClassRetryable, Reason: ReasonConnect, Health: HealthExcluded, Conn: HealthExcluded}
	}
	// A status came back: the connection works.
	v := Verdict{Class: ClassSuccess, Health: HealthSuccess}
	switch {
	case o.StreamFailed:
		v = EventFailure(o.StreamError)
	case o.Status == 429 && o.InsufficientQuota:
		v = Verdict{Class: ClassPassThrough, Health: HealthExcluded}
	case o.Status == 429:
		v = Verdict{Class: ClassRetryable, Reason: Reason429, Health: HealthExcluded}
	case o.Status == 508:
		// Loop Detected (a proxy's, Sturdy's own among them): the request
		// came back to where it was; no retry can help, nor is the
		// server failing.
		v = Verdict{Class: ClassPassThrough, Health: HealthExcluded}
	case o.Status >= 500:
		v = Verdict{Class: ClassRetryable, Reason: Reason5xx, Health: HealthFailure}
	case o.Status >= 400:
		v = Verdict{Class: ClassPassThrough, Health: HealthSuccess}
	}
	v.Conn = HealthSuccess
	return v
}

// Label names the attempt's result for metrics, logs and traces: its
// reason when it is retryable (429, 5xx, timeout …), else its class.
func (v Verdict) Label() string {
	if v.Class == ClassRetryable {
		return v.Reason.String()
	}
	return v.Class.String()
}
