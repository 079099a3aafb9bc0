package proxy

import (
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"sturdy/policy"
)

// Codes of the errors Sturdy writes itself (error.code in the body).
const (
	CodeRetriesExhausted    = "retries_exhausted"
	CodeCircuitOpen         = "circuit_open"
	CodeUpstreamUnreachable = "upstream_unreachable"
	CodeUpstreamTimeout     = "upstream_timeout"
	CodeRequestTooLarge     = "request_too_large"
	CodeBadRequest          = "bad_request"
	CodeStreamInterrupted   = "stream_interrupted"
	CodeRateLimited         = "rate_limited"
	CodeUpstreamBusy        = "upstream_busy"
	CodeDeadlineExceeded    = "deadline_exceeded"
	CodeInvalidAPIKey       = "invalid_api_key"
)

// ErrorType is error.type of every error Sturdy writes itself.
const ErrorType = "sturdy_error"

// errorDetails is the "sturdy" object of an error body: what Sturdy knows
// about the failure. Zero fields are left out.
type errorDetails struct {
	Upstream     string `json:"upstream,omitempty"`
	Attempts     int    `json:"attempts,omitempty"`
	LastStatus   int    `json:"last_status,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

type errorBody struct {
	Error struct {
		Message string       `json:"message"`
		Type    string       `json:"type"`
		Code    string       `json:"code"`
		Param   *string      `json:"param"`
		Sturdy  errorDetails `json:"sturdy"`
	} `json:"error"`
}

// errorJSON renders an OpenAI-shaped error body.
func errorJSON(code, message string, d errorDetails) []byte {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code, b.Error.Sturdy = message, ErrorType, code, d
	out, _ := json.Marshal(&b) // cannot fail: plain strings and ints
	return out
}

// writeError answers the client with an error Sturdy wrote itself: an
// OpenAI-shaped body, x-should-retry: false so SDKs do not multiply our
// retries, and Retry-After/retry-after-ms when a wait is known.
func writeError(ctx *fasthttp.RequestCtx, status int, code, message string, d errorDetails, retryAfter time.Duration) {
	r := &ctx.Response
	r.Reset()
	r.SetStatusCode(status)
	r.Header.SetContentType("application/json")
	r.Header.SetBytesKV(hdrShouldRetry, valFalse)
	if retryAfter > 0 {
		secs := int64((retryAfter + time.Second - 1) / time.Second)
		r.Header.SetBytesKV(hdrRetryAfter, strconv.AppendInt(nil, max(secs, 1), 10))
		r.Header.SetBytesKV(hdrRetryAfterMS, strconv.AppendInt(nil, retryAfter.Milliseconds(), 10))
		d.RetryAfterMS = retryAfter.Milliseconds()
	}
	r.SetBody(errorJSON(code, message, d))
}

// dialError marks a failure to open a connection: the request provably
// never left Sturdy, so even a non-replayable write may be retried.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dial upstream: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// errStreamAborted is what the client-side body reader returns to make
// fasthttp cut the client connection: a stream that failed must never end
// as if it had succeeded.
var errStreamAborted = errors.New("upstream stream failed mid-body")

// faultOf maps a fasthttp client error to the attempt's fault.
func faultOf(err error) policy.Fault {
	var de *dialError
	switch {
	case errors.As(err, &de), errors.Is(err, fasthttp.ErrNoFreeConns), errors.Is(err, fasthttp.ErrDialTimeout):
		return policy.FaultConnect
	case isTimeout(err):
		return policy.FaultTimeout
	default:
		return policy.FaultReset
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
