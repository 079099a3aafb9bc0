package proxy

import (
	"fmt"
	"unsafe"

	"github.com/valyala/fasthttp"

	"sturdy/policy"
)

var (
	hdrOrigin            = []byte("Origin")
	hdrVary              = []byte("Vary")
	hdrACRequestMethod   = []byte("Access-Control-Request-Method")
	hdrACRequestHeaders  = []byte("Access-Control-Request-Headers")
	hdrACAllowOrigin     = []byte("Access-Control-Allow-Origin")
	hdrACAllowMethods    = []byte("Access-Control-Allow-Methods")
	hdrACAllowHeaders    = []byte("Access-Control-Allow-Headers")
	hdrACAllowCreds      = []byte("Access-Control-Allow-Credentials")
	hdrACExposeHeaders   = []byte("Access-Control-Expose-Headers")
	hdrACMaxAge          = []byte("Access-Control-Max-Age")
	valOrigin            = []byte("Origin")
	valPreflightMaxAge   = []byte("600")
	maxPreflightHeaderLn = 1024
)

// crossOrigin refuses, before routing, what a web page may not do
// through Sturdy (the configuration tbl says who may); answered says it
// answered a CORS preflight itself.
//
// On a loopback address the Host and the Origin must be local
// (policy.LocalHost, LocalOrigin) or in server.cors_origins: a page that
// rebinds its name to 127.0.0.1, or posts a form across sites, is
// refused. A preflight is never forwarded: it gets permission only for
// an origin server.cors_origins lists.
func crossOrigin(ctx *fasthttp.RequestCtx, tbl *table) (e *apiError, answered bool) {
	h := &ctx.Request.Header
	origin := h.PeekCanonical(hdrOrigin)
	granted := len(origin) > 0 && policy.CORSAllowed(text(origin), tbl.corsOrigins)
	if ctx.LocalIP().IsLoopback() {
		host := h.Host()
		if !policy.LocalHost(text(host), tbl.allowedHosts) {
			return notLocal("Host", host), false
		}
		if len(origin) > 0 && !granted && !policy.LocalOrigin(text(origin), text(host), tbl.allowedHosts) {
			return notLocal("Origin", origin), false
		}
	}
	if !ctx.IsOptions() || len(origin) == 0 || len(h.PeekCanonical(hdrACRequestMethod)) == 0 {
		return nil, false
	}
	if !granted {
		return newError(CodeOriginNotAllowed, fmt.Sprintf("Sturdy answers CORS preflights itself, and grants only the origins server.cors_origins lists; %q is not one",
			origin[:policy.RuneCut(origin, 256)])), false
	}
	rh := &ctx.Response.Header
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	grant(rh, origin)
	rh.SetBytesKV(hdrACAllowMethods, h.PeekCanonical(hdrACRequestMethod))
	if asked := h.PeekCanonical(hdrACRequestHeaders); len(asked) > 0 && len(asked) <= maxPreflightHeaderLn {
		rh.SetBytesKV(hdrACAllowHeaders, asked)
	}
	rh.SetBytesKV(hdrACMaxAge, valPreflightMaxAge)
	return nil, true
}

// notLocal refuses a request on a loopback address whose Host or Origin
// (what) is v, not a local name.
func notLocal(what string, v []byte) *apiError {
	return newError(CodeOriginNotAllowed, fmt.Sprintf("Sturdy listens on a loopback address, and this request's %s %q is not a local name: "+
		"a web page may be rebinding its name to reach it, or posting across sites. If the name is yours, add it to "+
		"server.allowed_hosts (a page's origin to server.cors_origins)", what, v[:policy.RuneCut(v, 256)]))
}

// markCORS decides what a browser's page may read of an answer rh to a
// request with header h: Sturdy's permission for a granted origin
// (server.cors_origins, in origins), never the upstream's own, which it
// drops. A request without an Origin is no browser's: nothing to do.
func markCORS(rh *fasthttp.ResponseHeader, h *fasthttp.RequestHeader, origins []string) {
	origin := h.PeekCanonical(hdrOrigin)
	if len(origin) == 0 {
		return
	}
	if len(rh.PeekBytes(hdrACAllowOrigin)) > 0 {
		for _, k := range [...][]byte{hdrACAllowOrigin, hdrACAllowCreds, hdrACAllowMethods, hdrACAllowHeaders, hdrACExposeHeaders, hdrACMaxAge} {
			rh.DelBytes(k)
		}
	}
	if policy.CORSAllowed(text(origin), origins) {
		grant(rh, origin)
	}
}

// grant gives the page at origin permission to read the answer.
func grant(rh *fasthttp.ResponseHeader, origin []byte) {
	rh.SetBytesKV(hdrACAllowOrigin, origin)
	rh.AddBytesKV(hdrVary, valOrigin)
}

// text is b as a string, in place: for reading while b is unchanged.
func text(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
