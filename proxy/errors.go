package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"sturdy/policy"
	"sturdy/upstream"
)

// Codes of the errors Sturdy writes itself (error.code in the body). Each
// has one row in errorTable.
const (
	CodeBadRequest          = "bad_request"
	CodeHeadersTooLarge     = "request_headers_too_large"
	CodeRequestTimeout      = "request_timeout"
	CodeRequestTooLarge     = "request_too_large"
	CodeRouteNotFound       = "route_not_found"
	CodeAPINotServed        = "api_not_served"
	CodeInvalidAPIKey       = "invalid_api_key"
	CodeRateLimited         = "rate_limited"
	CodeBudgetExceeded      = "budget_exceeded"
	CodeCircuitOpen         = "circuit_open"
	CodeUpstreamBusy        = "upstream_busy"
	CodeUpstreamUnreachable = "upstream_unreachable"
	CodeRetriesExhausted    = "retries_exhausted"
	CodeUpstreamTimeout     = "upstream_timeout"
	CodeDeadlineExceeded    = "deadline_exceeded"
	CodeShuttingDown        = "shutting_down"
	CodeTooManyConnections  = "too_many_connections"
	CodeStreamInterrupted   = "stream_interrupted"
	CodeResponseTooLarge    = "response_too_large"
	CodeLoopDetected        = "loop_detected"
	CodeSharedState         = "shared_state_unavailable"
	CodeInternalError       = "internal_error"
	CodeServerBusy          = "server_busy"
	CodeOriginNotAllowed    = "origin_not_allowed"
)

// ErrorType is error.type of every error Sturdy writes itself.
const ErrorType = "sturdy_error"

// errorSpec is one row of Sturdy's error vocabulary.
type errorSpec struct {
	code string
	// status is the HTTP status; 0 for an error sent inside a stream.
	status int
	// message is a format: the facts of the case fill its verbs.
	message string
	// when says when it is sent, as in the docs' error table.
	when string
	// sdkRetries leaves x-should-retry out, so the client's SDK may retry
	// (elsewhere): set only where no upstream was asked to answer.
	sdkRetries bool
	// anthropic is error.type in Anthropic's shape (the Messages API's
	// paths): the type its SDKs know the case by.
	anthropic string
}

// errorTable is every error Sturdy writes itself: code → status, message.
// docs/failures-and-retries.md's table of codes is checked against it by a test.
var errorTable = []errorSpec{
	{code: CodeBadRequest, anthropic: "invalid_request_error", status: 400,
		message: "bad request: %s",
		when:    "malformed HTTP, CONNECT or absolute-URI requests (Sturdy is not an open proxy), both `Content-Length` and `Transfer-Encoding`, a path whose dot-segments leave its route's `path_prefix`, a `#` (fragment) in the request target"},
	{code: CodeHeadersTooLarge, anthropic: "request_too_large", status: 431,
		message: "request headers exceed %s (server.max_header_bytes); send fewer or smaller headers",
		when:    "request line and headers over `server.max_header_bytes`"},
	{code: CodeRequestTimeout, anthropic: "invalid_request_error", status: 408,
		message: "the request was not received within %s (server.read_timeout); send it whole, without pauses",
		when:    "the request line, headers and body did not arrive within `server.read_timeout` (a slowloris, a body that never ends)"},
	{code: CodeRequestTooLarge, anthropic: "request_too_large", status: 413,
		message: "request body is larger than %s accepts (%d bytes); send a smaller request",
		when:    "body over the route's `max_body`"},
	{code: CodeLoopDetected, anthropic: "api_error", status: 508,
		message: "the request came back to the Sturdy that sent it (its Via header names this process): an upstream's url or DNS name points at Sturdy itself; fix the upstream",
		when:    "the request's `Via` names this Sturdy process: an upstream (or a DNS-discovered endpoint) is Sturdy's own listener"},
	{code: CodeOriginNotAllowed, anthropic: "permission_error", status: 403,
		message: "%s",
		when:    "on a loopback address, a `Host` or `Origin` that is not a local name nor in `server.allowed_hosts` (DNS rebinding, a cross-site form); a CORS preflight from an origin `server.cors_origins` does not list"},
	{code: CodeRouteNotFound, anthropic: "not_found_error", status: 404,
		message: "no route serves path %q (and this body's model); configure a route whose path_prefix (and model) matches it",
		when:    "no route's `path_prefix` (and `model`) matches the request"},
	{code: CodeAPINotServed, anthropic: "not_found_error", status: 404,
		message: "no target of route %q serves %s (its upstreams' apis); send it to a route whose upstreams do",
		when:    "the route's targets all declare `apis` without the request's (OpenAI's, or Anthropic's Messages API)"},
	{code: CodeInvalidAPIKey, anthropic: "authentication_error", status: 401,
		message: "missing or invalid API key: send the key Sturdy issued you as \"Authorization: Bearer <key>\" (or \"x-api-key: <key>\")",
		when:    "`auth` is on and the request has no accepted key (`Authorization: Bearer <key>`, else `x-api-key: <key>`)"},
	{code: CodeRateLimited, anthropic: "rate_limit_error", status: 429,
		message: "%s; retry after the Retry-After delay",
		when:    "the client is over its `clients` limit or token budget, or every target is cooling down after a 429 / paced past `max_wait` (its `rate_limit`, its `tokens_per_minute`) (`Retry-After` and `retry-after-ms` say when to come back)"},
	{code: CodeBudgetExceeded, anthropic: "rate_limit_error", status: 429,
		message: "%s; no retry helps before then",
		when:    "the client spent its `spend` budget for the period (a UTC day or month) at `prices`; `Retry-After` is the period's end"},
	{code: CodeCircuitOpen, anthropic: "overloaded_error", status: 503,
		message: "%s is failing: %s%s; Sturdy is not sending it traffic. Retry after the Retry-After delay",
		when:    "the upstream's connection breaker, or the model's reply breaker on it, is open; `Retry-After` = seconds until the next probe"},
	{code: CodeUpstreamBusy, anthropic: "overloaded_error", status: 503,
		message: "upstream %q is running as many requests as it is allowed (%s)%s; retry after the Retry-After delay",
		when:    "the upstream's `max_in_flight` slots, its `max_connections`, or an endpoint's `concurrency` limit stayed full for `queue_timeout`, or that endpoint's queue was full (`Retry-After` from how fast its queue drains); SDKs retry it after that wait", sdkRetries: true},
	{code: CodeUpstreamUnreachable, anthropic: "api_error", status: 502,
		message: "upstream %q %s (%s); retry later or check the upstream",
		when:    "one attempt, no response (connect failure or reset)"},
	{code: CodeRetriesExhausted, anthropic: "api_error", status: 502,
		message: "upstream %q %s (%s); retry later or check the upstream",
		when:    "several attempts, none produced a response, the last failed to connect or was reset"},
	{code: CodeUpstreamTimeout, anthropic: "timeout_error", status: 504,
		message: "upstream %q sent no response in time (%s); retry later, or allow more time (timeouts.first_byte, the request's timeout)",
		when:    "the last attempt (of one or several) sent no response within `first_byte` / `first_token`"},
	{code: CodeDeadlineExceeded, anthropic: "timeout_error", status: 504,
		message: "the request's deadline passed before any upstream answered; last: upstream %q (%s); retry later or check the upstream",
		when:    "the request's deadline (route or client) passed before any upstream answered; the message names every target tried"},
	{code: CodeShuttingDown, anthropic: "overloaded_error", status: 503,
		message: "Sturdy is shutting down and stopped waiting to try upstream %q again (%s); retry the request",
		when:    "Sturdy began shutting down while the request waited (backoff, `Retry-After`, cooldown, pacing, a `max_in_flight` slot) and no upstream reply was at hand; sent without `x-should-retry`, so SDKs retry it (on another replica)", sdkRetries: true},
	{code: CodeTooManyConnections, anthropic: "overloaded_error", status: 503,
		message: "Sturdy is serving as many client connections as it allows (%d, server.max_connections); retry after the Retry-After delay",
		when:    "a new client connection would pass `server.max_connections`: answered at once and closed"},
	{code: CodeServerBusy, anthropic: "overloaded_error", status: 503,
		message: "Sturdy holds as many request bodies as it allows (%s, server.max_request_bytes, all requests together); retry after the Retry-After delay",
		when:    "the request bodies held by requests in flight would pass `server.max_request_bytes`: refused before the body is read when it has a `Content-Length` (`Retry-After: 1`)", sdkRetries: true},
	{code: CodeSharedState, anthropic: "api_error", status: 503,
		message: "the fleet's shared state (Redis) %s, and shared_state.on_failure is refuse; retry after the Retry-After delay",
		when:    "with `shared_state.on_failure: refuse`, Redis did not answer a shared limit in time (or is down)", sdkRetries: true},
	{code: CodeResponseTooLarge, anthropic: "api_error", status: 502,
		message: "upstream %q sent a reply of unknown length larger than Sturdy holds for an HTTP/1.0 client (%s); ask over HTTP/1.1, which gets it streamed",
		when:    "an HTTP/1.0 client's reply of unknown length, read whole first, passed 64 MiB, or `server.max_buffered_bytes` (for all clients together) was in use"},
	{code: CodeInternalError, anthropic: "api_error", status: 500,
		message: "Sturdy failed while serving this request (a bug, logged with request id and stack); retry the request",
		when:    "a panic while serving the request, recovered: the process serves on, the panic is logged and counted (`sturdy_panics_total`)"},
	{code: CodeStreamInterrupted, anthropic: "api_error", status: 0,
		message: "%s from upstream %q; the output so far is incomplete: retry the request",
		when:    "sent *inside* a stream that failed after it started (streams-and-rescue.md)"},
}

// specOf returns code's row of errorTable.
func specOf(code string) errorSpec {
	for _, s := range errorTable {
		if s.code == code {
			return s
		}
	}
	panic("proxy: error code " + code + " is not in errorTable")
}

// errorDetails is the "sturdy" object of an error body: what Sturdy knows
// about the failure. Zero fields are left out.
type errorDetails struct {
	Upstream     string `json:"upstream,omitempty"`
	Attempts     int    `json:"attempts,omitempty"`
	LastStatus   int    `json:"last_status,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

// apiError is one error Sturdy answers with: a row of errorTable with the
// facts of the case.
type apiError struct {
	spec       errorSpec
	msg        string
	details    errorDetails
	retryAfter time.Duration // 0: no Retry-After
	// tokens is the budget that refused the request, for its headers.
	tokens tokenHeaders
}

// tokenHeaders is a token budget as a refusal tells it: OpenAI's
// x-ratelimit-{limit,remaining,reset}-tokens, or on the Messages API
// anthropic-ratelimit-<kind>-{limit,remaining,reset} (reset an RFC 3339
// time).
type tokenHeaders struct {
	kind  tokenKind
	state policy.TokenState
	set   bool
}

// write sets t's headers on r for a request of api.
func (t tokenHeaders) write(h *fasthttp.ResponseHeader, api policy.API) {
	if !t.set {
		return
	}
	st := t.state
	remaining := strconv.FormatInt(max(st.Remaining, 0), 10)
	if api == policy.APIAnthropic {
		name := "anthropic-ratelimit-" + anthropicTokenHeaders[t.kind]
		h.Set(name+"-limit", strconv.FormatInt(st.Limit, 10))
		h.Set(name+"-remaining", remaining)
		h.Set(name+"-reset", time.Now().Add(st.Reset).UTC().Format(time.RFC3339))
		return
	}
	h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(st.Limit, 10))
	h.Set("x-ratelimit-remaining-tokens", remaining)
	h.Set("x-ratelimit-reset-tokens", st.Reset.Round(time.Millisecond).String())
}

// newError builds the error for code; args fill its message's verbs.
func newError(code string, args ...any) *apiError {
	s := specOf(code)
	return &apiError{spec: s, msg: fmt.Sprintf(s.message, args...)}
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

// errorShape is how one API's clients read an error Sturdy writes: the
// body of an error response, and the event that ends an SSE stream
// failed mid-answer. errorShapes holds one per API: every error body
// Sturdy writes is rendered from it (a new API adds its row).
type errorShape struct {
	// body renders an error response's body (requestID: the request's id).
	body func(e *apiError, requestID []byte) []byte
	// event appends to b the SSE event that ends a failed stream, its
	// events so far numbering seq.
	event func(b []byte, e *apiError, seq int) []byte
}

// errorShapes are the error shapes by API: OpenAI's error object
// everywhere, for the Responses API its own stream error event, and on
// the Messages API's paths Anthropic's error object and event.
var errorShapes = [...]errorShape{
	policy.APIOther:       {body: openAIBody, event: openAIEvent},
	policy.APIChat:        {body: openAIBody, event: openAIEvent},
	policy.APICompletions: {body: openAIBody, event: openAIEvent},
	policy.APIResponses:   {body: openAIBody, event: responsesEvent},
	policy.APIOllama:      {body: openAIBody, event: openAIEvent},
	policy.APIAnthropic:   {body: anthropicBody, event: anthropicEvent},
}

// shapeOf returns api's error shape.
func shapeOf(api policy.API) errorShape {
	if int(api) < len(errorShapes) && errorShapes[api].body != nil {
		return errorShapes[api]
	}
	return errorShapes[policy.APIOther]
}

// openAIBody renders the OpenAI-shaped error body.
func openAIBody(e *apiError, _ []byte) []byte {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code, b.Error.Sturdy = e.msg, ErrorType, e.spec.code, e.details
	if e.retryAfter > 0 {
		b.Error.Sturdy.RetryAfterMS = e.retryAfter.Milliseconds()
	}
	out, _ := json.Marshal(&b) // cannot fail: plain strings and ints
	return out
}

// openAIEvent is the error body as an unnamed SSE event (data: only), as
// OpenAI's chat completions streams tell an error.
func openAIEvent(b []byte, e *apiError, _ int) []byte {
	b = append(b, "data: "...)
	return append(append(b, openAIBody(e, nil)...), "\n\n"...)
}

// anthropicError is Anthropic's error object ({"type":"error","error":
// {"type","message"},"request_id"}), with Sturdy's own facts under
// "sturdy", a key its SDKs ignore.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id,omitempty"`
	Sturdy    struct {
		Code string `json:"code"`
		errorDetails
	} `json:"sturdy"`
}

// anthropicBody renders the Anthropic-shaped error body.
func anthropicBody(e *apiError, requestID []byte) []byte {
	var b anthropicError
	b.Type, b.Error.Type, b.Error.Message, b.RequestID = "error", e.spec.anthropic, e.msg, string(requestID)
	b.Sturdy.Code, b.Sturdy.errorDetails = e.spec.code, e.details
	if e.retryAfter > 0 {
		b.Sturdy.RetryAfterMS = e.retryAfter.Milliseconds()
	}
	out, _ := json.Marshal(&b) // cannot fail: plain strings and ints
	return out
}

// anthropicEvent is the error as the Messages API's stream tells one
// (event: error), which its SDKs raise.
func anthropicEvent(b []byte, e *apiError, _ int) []byte {
	b = append(b, "event: error\ndata: "...)
	return append(append(b, anthropicBody(e, nil)...), "\n\n"...)
}

// responsesEvent is the Responses API's error event (type "error", code,
// message, param, sequence_number), with the error object of openAIBody
// beside them: openai-go raises on that, the Node SDK on the event's
// type.
func responsesEvent(b []byte, e *apiError, sequence int) []byte {
	var ev struct {
		Type     string  `json:"type"`
		Code     string  `json:"code"`
		Message  string  `json:"message"`
		Param    *string `json:"param"`
		Sequence int     `json:"sequence_number"`
		errorBody
	}
	ev.Type, ev.Code, ev.Message, ev.Sequence = "error", e.spec.code, e.msg, sequence
	ev.Error.Message, ev.Error.Type, ev.Error.Code, ev.Error.Sturdy = e.msg, ErrorType, e.spec.code, e.details
	out, _ := json.Marshal(&ev)
	b = append(b, "event: error\ndata: "...)
	return append(append(b, out...), "\n\n"...)
}

// write answers the client of api with the error: its status, a body of
// the API's shape, x-should-retry: false so SDKs do not multiply our
// retries (unless the row says they may), and Retry-After/retry-after-ms
// when a wait is known. Every error response Sturdy writes goes through
// here.
func (e *apiError) write(ctx *fasthttp.RequestCtx, requestID []byte, api policy.API) {
	e.writeTo(&ctx.Response, requestID, api)
}

// writeTo renders the error into r (see write).
func (e *apiError) writeTo(r *fasthttp.Response, requestID []byte, api policy.API) {
	r.Reset()
	r.SetStatusCode(e.spec.status)
	r.Header.SetContentType("application/json")
	if !e.spec.sdkRetries {
		r.Header.SetBytesKV(hdrShouldRetry, valFalse)
	}
	r.Header.SetBytesKV(hdrRequestID, requestID)
	if e.retryAfter > 0 {
		secs := int64((e.retryAfter + time.Second - 1) / time.Second)
		r.Header.SetBytesKV(hdrRetryAfter, strconv.AppendInt(nil, max(secs, 1), 10))
		r.Header.SetBytesKV(hdrRetryAfterMS, strconv.AppendInt(nil, e.retryAfter.Milliseconds(), 10))
	}
	e.tokens.write(&r.Header, api)
	r.SetBody(shapeOf(api).body(e, requestID))
}

// errStreamAborted is what the client-side body reader returns to make
// fasthttp cut the client connection: a stream that failed must never end
// as if it had succeeded.
var errStreamAborted = errors.New("upstream stream failed mid-body")

// WhyUnreachable names, in a few fixed words (never quoting a server),
// why an attempt got no response: the OS's or the TLS library's reason.
func WhyUnreachable(err error) string {
	var dns *net.DNSError
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	var invalid x509.CertificateInvalidError
	var tlsErr *tls.CertificateVerificationError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.As(err, &dns) && dns.IsNotFound:
		return "no such host"
	case errors.As(err, &dns):
		return "DNS lookup failed"
	case errors.As(err, &unknownCA):
		return "TLS: certificate signed by unknown authority (set tls.ca_file)"
	case errors.As(err, &badHost):
		return "TLS: certificate is not valid for this host name"
	case errors.As(err, &invalid):
		return "TLS: certificate invalid or expired"
	case errors.As(err, &tlsErr):
		return "TLS: certificate not verified"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to host"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, fasthttp.ErrDialTimeout), upstream.IsTimeout(err):
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection closed"
	}
	return "connection failed"
}

// refusedConnection reports whether a connection was refused (or had no
// route): nothing listens there — a server killed, or not up yet.
func refusedConnection(err error) bool {
	var de *upstream.DialError
	return errors.As(err, &de) && (errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH))
}

// faultOf maps a fasthttp client error to the attempt's fault.
func faultOf(err error) policy.Fault {
	var de *upstream.DialError
	switch {
	case errors.As(err, &de) && de.LocalFault():
		return policy.FaultLocal
	case errors.As(err, &de), errors.Is(err, fasthttp.ErrNoFreeConns), errors.Is(err, fasthttp.ErrDialTimeout):
		return policy.FaultConnect
	case upstream.IsTimeout(err):
		return policy.FaultTimeout
	default:
		return policy.FaultReset
	}
}

// sizeText says a byte count as a person would: 32 KiB, 1 MiB, 900 bytes.
func sizeText(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
