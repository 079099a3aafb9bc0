package proxy

import (
	"time"

	"github.com/rs/zerolog"
)

// Access-log field names.
const (
	fieldID            = "id"
	fieldMethod        = "method"
	fieldPath          = "path"
	fieldRoute         = "route"
	fieldUpstream      = "upstream"
	fieldEndpoint      = "endpoint"
	fieldStatus        = "status"
	fieldAttempts      = "attempts"
	fieldRetries       = "retries"
	fieldWaits         = "waits"
	fieldClientKey     = "client_key"
	fieldStop          = "stop"
	fieldBreaker       = "breaker"
	fieldModelBreaker  = "model_breaker"
	fieldStream        = "stream"
	fieldBytesOut      = "bytes_out"
	fieldTTFB          = "ttfb_ms"
	fieldTTFT          = "ttft_ms"
	fieldDuration      = "duration_ms"
	fieldOutcome       = "outcome"
	fieldError         = "error"
	fieldTargets       = "targets"
	fieldPhase         = "phase"
	fieldCause         = "cause"
	fieldRescued       = "rescued"
	fieldRescuedBy     = "rescued_by"
	fieldSeam          = "seam_bytes"
	fieldFirstUsage    = "first_usage"
	fieldRescueRefused = "rescue_refused"
	fieldTraceID       = "trace_id"
)

// Outcomes: how a request ended, in the access log and the
// sturdy_requests_total outcome label (a fixed vocabulary).
const (
	outcomeOK                = "ok"                       // a success reply
	outcomePassThrough       = "pass_through"             // the client's own error, untouched
	outcomeExhausted         = "exhausted"                // the last upstream reply, retrying over
	outcomeCircuitOpen       = "circuit_open"             // every target's breaker open
	outcomeRateLimited       = "rate_limited"             // a 429 Sturdy answered itself
	outcomeUpstreamBusy      = "upstream_busy"            // no max_in_flight slot or connection place in time
	outcomeUpstreamError     = "upstream_error"           // no upstream reply at all
	outcomeRejected          = "rejected"                 // refused before any attempt (400/404/413/431)
	outcomeUnauthorized      = "unauthorized"             // no accepted client key
	outcomeStreamInterrupted = "stream_interrupted"       // the upstream failed mid-stream
	outcomeClientGone        = "client_gone"              // the client left mid-response
	outcomeShuttingDown      = "shutting_down"            // a wait ended by shutdown, no reply at hand
	outcomeSharedState       = "shared_state_unavailable" // Redis did not answer, on_failure: refuse
	outcomeInternalError     = "internal_error"           // a panic while serving it, recovered (survive)
)

// retryList logs the retries of a request as
// [{"reason":..,"endpoint":..,"wait_ms":..}].
type retryList []retryNote

func (l retryList) MarshalZerologArray(a *zerolog.Array) {
	for _, r := range l {
		a.Object(r)
	}
}

func (r retryNote) MarshalZerologObject(e *zerolog.Event) {
	e.Str("reason", r.reason.String())
	if r.endpoint != "" {
		e.Str("endpoint", r.endpoint)
	}
	e.Float64("wait_ms", float64(r.wait)/float64(time.Millisecond))
}

// waits is the time a request waited, by who set the wait; logged in
// milliseconds as {"concurrency":..,"server":..}, the sources that
// waited only.
type waits [waitSources]time.Duration

func (w *waits) any() bool {
	for _, d := range w {
		if d > 0 {
			return true
		}
	}
	return false
}

// dict is the waits as a zerolog dictionary (from zerolog's pool: a
// pointer to the summary's array in an interface would move every
// request's summary to the heap).
func (w *waits) dict() *zerolog.Event {
	e := zerolog.Dict()
	for s, d := range w {
		if d > 0 {
			e.Float64(waitSource(s).String(), float64(d)/float64(time.Millisecond))
		}
	}
	return e
}

// targetList logs the targets tried as [{"upstream":..,"attempts":..,"result":..}].
type targetList []targetNote

func (l targetList) MarshalZerologArray(a *zerolog.Array) {
	for _, t := range l {
		a.Object(t)
	}
}

func (t targetNote) MarshalZerologObject(e *zerolog.Event) {
	e.Str("upstream", t.upstream)
	if t.model != "" {
		e.Str("model", t.model)
	}
	if t.endpoint != "" {
		e.Str("endpoint", t.endpoint)
	}
	e.Int("attempts", t.attempts).Str("result", t.result)
	if t.breaker != "" {
		e.Str("breaker", t.breaker)
	}
}

// logAccess writes the request's one access line to log, from its
// summary. It never logs header values other than the request id, nor
// bodies, nor the query string.
func (s *summary) logAccess(log *zerolog.Logger) {
	ev := log.Info()
	if !ev.Enabled() {
		return
	}
	ev.Bytes(fieldID, s.id).Bytes(fieldMethod, s.method).Bytes(fieldPath, s.path)
	if s.rt != nil {
		ev.Str(fieldRoute, s.route).Str(fieldUpstream, s.upstream)
		if s.endpoint != "" {
			ev.Str(fieldEndpoint, s.endpoint).Str(fieldBreaker, s.breaker).Str(fieldModelBreaker, s.modelBreaker)
		} else {
			ev.Str(fieldBreaker, s.breaker)
		}
	}
	if s.clientKey != "" {
		ev.Str(fieldClientKey, s.clientKey)
	}
	ev.Int(fieldStatus, s.status).Int(fieldAttempts, s.attempts)
	if len(s.targets) > 0 {
		ev.Array(fieldTargets, targetList(s.targets))
	}
	if len(s.retries) > 0 {
		ev.Array(fieldRetries, retryList(s.retries))
	}
	if s.waits.any() {
		ev.Dict(fieldWaits, s.waits.dict())
	}
	if s.stop.Ended() {
		ev.Str(fieldStop, s.stop.String())
	}
	if s.errCode != "" {
		ev.Str(fieldError, s.errCode)
	}
	if s.cause != "" {
		ev.Str(fieldCause, s.cause)
	}
	if s.outcome == outcomeClientGone {
		ev.Str(fieldPhase, s.gonePhase.String())
	}
	if s.rescueTries > 0 || s.refused != "" {
		s.logRescue(ev)
	}
	if s.traced {
		ev.Str(fieldTraceID, s.traceID.String())
	}
	ev.Bool(fieldStream, s.streaming).
		Int64(fieldBytesOut, s.bytesOut).
		Float64(fieldTTFB, float64(s.ttfb)/float64(time.Millisecond)).
		Float64(fieldTTFT, float64(s.ttft)/float64(time.Millisecond)).
		Float64(fieldDuration, float64(s.dur)/float64(time.Millisecond)).
		Str(fieldOutcome, s.outcome).
		Msg("request")
}

// logRescue adds to ev what became of a stream cut mid-answer.
func (s *summary) logRescue(ev *zerolog.Event) {
	ev.Int(fieldRescued, s.rescued)
	if s.rescued > 0 {
		// The cut call never sent its usage: the continuation's is all the
		// client got.
		ev.Str(fieldRescuedBy, s.rescuedBy).Int64(fieldSeam, s.seam).Str(fieldFirstUsage, "unknown")
	}
	if s.refused != "" {
		ev.Str(fieldRescueRefused, s.refused)
	}
}
