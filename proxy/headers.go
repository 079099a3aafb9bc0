package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1 (and the de
// facto Proxy-Connection): they describe one connection, so a proxy drops
// them in both directions. Headers named in Connection are dropped too.
var hopHeaders = [][]byte{
	[]byte("Connection"),
	[]byte("Keep-Alive"),
	[]byte("Proxy-Connection"),
	[]byte("Proxy-Authenticate"),
	[]byte("Proxy-Authorization"),
	[]byte("Te"),
	[]byte("Trailer"),
	[]byte("Transfer-Encoding"),
	[]byte("Upgrade"),
}

// Header names Sturdy reads or writes.
var (
	hdrConnection     = []byte("Connection")
	hdrAuthorization  = []byte("Authorization")
	hdrXAPIKey        = []byte("X-Api-Key")
	hdrRequestID      = []byte("X-Request-Id")
	hdrForwardedFor   = []byte("X-Forwarded-For")
	hdrForwardedHost  = []byte("X-Forwarded-Host")
	hdrForwardedProto = []byte("X-Forwarded-Proto")
	hdrIdempotencyKey = []byte("Idempotency-Key")
	hdrExpect         = []byte("Expect")
	hdrRetryAfter     = []byte("Retry-After")
	hdrRetryAfterMS   = []byte("Retry-After-Ms")
	hdrAttempts       = []byte("X-Sturdy-Attempts")
	hdrShouldRetry    = []byte("X-Should-Retry")
	hdrUpstream       = []byte("X-Sturdy-Upstream")
	hdrPriority       = []byte("X-Sturdy-Priority")
	hdrVia            = []byte("Via")

	hdrStainlessTimeout     = []byte("X-Stainless-Timeout")
	hdrStainlessReadTimeout = []byte("X-Stainless-Read-Timeout")
	hdrStainlessLang        = []byte("X-Stainless-Lang")
	hdrRequestTimeout       = []byte("Request-Timeout")
	hdrXRequestTimeout      = []byte("X-Request-Timeout")
	hdrStainlessRetryCount  = []byte("X-Stainless-Retry-Count")
	hdrRateLimitRemaining   = []byte("X-Ratelimit-Remaining-Requests")
	hdrRateLimitReset       = []byte("X-Ratelimit-Reset-Requests")

	hdrRateLimitRemainingTokens = []byte("X-Ratelimit-Remaining-Tokens")
	hdrRateLimitResetTokens     = []byte("X-Ratelimit-Reset-Tokens")
	hdrDate                     = []byte("Date")
	valFalse                    = []byte("false")
	strHTTP11                   = []byte("HTTP/1.1")
	valHTTP                     = []byte("http")
	valHTTPS                    = []byte("https")
)

// headerDeleter is the part of fasthttp's request and response headers that
// dropHopHeaders needs.
type headerDeleter interface {
	PeekCanonical(key []byte) []byte
	DelBytes(key []byte)
}

// dropHopHeaders removes hop-by-hop headers and every header the
// Connection header names. It looks before it deletes (a lookup is cheaper
// than a delete): most messages carry none but Connection: keep-alive.
func dropHopHeaders(h headerDeleter) {
	if conn := h.PeekCanonical(hdrConnection); len(conn) > 0 &&
		!bytes.EqualFold(conn, []byte("keep-alive")) && !bytes.EqualFold(conn, []byte("close")) {
		// fasthttp hands back its internal buffer; deleting headers
		// reshuffles it, so work on a copy (rare: few clients name extra
		// headers in Connection).
		names := append([]byte(nil), conn...)
		for len(names) > 0 {
			var name []byte
			name, names, _ = bytes.Cut(names, []byte(","))
			if name = bytes.TrimSpace(name); len(name) > 0 {
				h.DelBytes(name)
			}
		}
	}
	for _, k := range hopHeaders {
		// hopHeaders are written as fasthttp stores names (normalized):
		// looked up as they are, not copied and normalized each time.
		if h.PeekCanonical(k) != nil {
			h.DelBytes(k)
		}
	}
}

// copyResponseHeaders copies the upstream's response headers to the
// client's response: status, every end-to-end header with its value bytes
// as received, nothing added.
func copyResponseHeaders(dst *fasthttp.ResponseHeader, src *fasthttp.ResponseHeader) {
	src.CopyTo(dst)
	// The client is answered in HTTP/1.1, whatever the upstream spoke.
	dst.SetProtocol(strHTTP11)
	dropHopHeaders(dst)
	dst.ResetConnectionClose()
	// What the upstream did not send, Sturdy does not invent.
	dst.SetNoDefaultContentType(true)
}

// bothFramings reports whether raw request headers carry both
// Content-Length and Transfer-Encoding, whatever their case on the wire.
// It scans the header lines once and allocates nothing.
func bothFramings(raw []byte) bool {
	var cl, te bool
	for len(raw) > 0 {
		var line []byte
		line, raw, _ = bytes.Cut(raw, []byte("\n"))
		k, _, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		k = bytes.TrimSpace(k)
		cl = cl || bytes.EqualFold(k, []byte("Content-Length"))
		te = te || bytes.EqualFold(k, []byte("Transfer-Encoding"))
	}
	return cl && te
}

// anthropicLimits are Anthropic's rate-limit header pairs (remaining,
// reset), in fasthttp's canonical form: any at 0 starts a cooldown until
// its reset (policy.AnthropicLimitExhausted).
var anthropicLimits = [][2][]byte{
	{[]byte("Anthropic-Ratelimit-Requests-Remaining"), []byte("Anthropic-Ratelimit-Requests-Reset")},
	{[]byte("Anthropic-Ratelimit-Tokens-Remaining"), []byte("Anthropic-Ratelimit-Tokens-Reset")},
	{[]byte("Anthropic-Ratelimit-Input-Tokens-Remaining"), []byte("Anthropic-Ratelimit-Input-Tokens-Reset")},
	{[]byte("Anthropic-Ratelimit-Output-Tokens-Remaining"), []byte("Anthropic-Ratelimit-Output-Tokens-Reset")},
}

// credential is a request's credential, by the one rule of the whole
// proxy (docs/clients.md, "Credentials"): key is the key itself — Authorization's
// after "Bearer ", else x-api-key (Claude Code and the Anthropic SDKs send
// only that) — what auth.keys checks; nil when there is none. id is the
// client it names, whichever header carries it: the key, or an
// Authorization of another scheme whole. The clients: limits with the
// default key_header, the token budgets and the cooldowns key on id.
func credential(h *fasthttp.RequestHeader) (id, key []byte) {
	a := h.PeekCanonical(hdrAuthorization)
	if k, ok := bytes.CutPrefix(a, []byte("Bearer ")); ok && len(k) > 0 {
		return k, k
	}
	if k := h.PeekCanonical(hdrXAPIKey); len(k) > 0 {
		return k, k
	}
	return a, nil
}
