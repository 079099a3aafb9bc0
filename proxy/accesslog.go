package proxy

import (
	"time"

	"github.com/rs/zerolog"

	"sturdy/policy"
)

// Access-log field names.
const (
	fieldID       = "id"
	fieldMethod   = "method"
	fieldPath     = "path"
	fieldRoute    = "route"
	fieldUpstream = "upstream"
	fieldStatus   = "status"
	fieldAttempts = "attempts"
	fieldRetries  = "retries"
	fieldStop     = "stop"
	fieldBreaker  = "breaker"
	fieldStream   = "stream"
	fieldBytesOut = "bytes_out"
	fieldTTFB     = "ttfb_ms"
	fieldDuration = "duration_ms"
	fieldOutcome  = "outcome"
	fieldError    = "error"
	fieldTargets  = "targets"
)

// Outcomes: how a request ended, in the access log and the
// sturdy_requests_total outcome label (a fixed vocabulary).
const (
	outcomeOK                = "ok"                 // a success reply
	outcomePassThrough       = "pass_through"       // the client's own error, untouched
	outcomeExhausted         = "exhausted"          // the last upstream reply, retrying over
	outcomeCircuitOpen       = "circuit_open"       // every target's breaker open
	outcomeRateLimited       = "rate_limited"       // a 429 Sturdy answered itself
	outcomeUpstreamBusy      = "upstream_busy"      // no max_in_flight slot in time
	outcomeUpstreamError     = "upstream_error"     // no upstream reply at all
	outcomeRejected          = "rejected"           // refused before any attempt (400/404/413/431)
	outcomeUnauthorized      = "unauthorized"       // no accepted client key
	outcomeStreamInterrupted = "stream_interrupted" // the upstream failed mid-stream
	outcomeClientGone        = "client_gone"        // the client left mid-response
)

// retryList logs the retries of a request as [{"reason":..,"wait_ms":..}].
type retryList []retryNote

func (l retryList) MarshalZerologArray(a *zerolog.Array) {
	for _, r := range l {
		a.Object(r)
	}
}

func (r retryNote) MarshalZerologObject(e *zerolog.Event) {
	e.Str("reason", r.reason.String()).Float64("wait_ms", float64(r.wait)/float64(time.Millisecond))
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
	e.Int("attempts", t.attempts).Str("result", t.result)
}

// logAccess writes the request's one access line. It never logs header
// values other than the request id, nor bodies, nor the query string.
func (ex *exchange) logAccess() {
	ev := ex.p.log.Info()
	if !ev.Enabled() {
		return
	}
	ctx := ex.ctx
	ev.Bytes(fieldID, ex.id).
		Bytes(fieldMethod, ctx.Method()).
		Bytes(fieldPath, rawPath(ctx.Request.Header.RequestURI()))
	if ex.route != nil {
		ev.Str(fieldRoute, ex.route.name).Str(fieldUpstream, ex.up.name).
			Str(fieldBreaker, ex.up.breaker.State().String())
	}
	ev.Int(fieldStatus, ex.status).Int(fieldAttempts, ex.attempts)
	if ex.nTried > 0 {
		ev.Array(fieldTargets, targetList(ex.tried[:ex.nTried]))
	}
	if ex.nRetries > 0 {
		ev.Array(fieldRetries, retryList(ex.retries[:ex.nRetries]))
	}
	if ex.stop != policy.StopNone && ex.stop != policy.StopFinal {
		ev.Str(fieldStop, ex.stop.String())
	}
	if ex.errCode != "" {
		ev.Str(fieldError, ex.errCode)
	}
	ev.Bool(fieldStream, ex.streaming).
		Int64(fieldBytesOut, ex.bytesOut).
		Float64(fieldTTFB, float64(ex.ttfb)/float64(time.Millisecond)).
		Float64(fieldDuration, float64(time.Since(ex.start))/float64(time.Millisecond)).
		Str(fieldOutcome, ex.outcome).
		Msg("request")
}
