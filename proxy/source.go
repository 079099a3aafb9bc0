package proxy

import (
	"bytes"
	"hash/maphash"
	"net/netip"

	"github.com/valyala/fasthttp"
)

// sourceOf is the client's source, as what is cheap to invent is grouped
// by: its address — from a trusted proxy, the last one its
// X-Forwarded-For names — an IPv6 one by its /64, hashed (never 0).
func sourceOf(ctx *fasthttp.RequestCtx, t *table) uint64 {
	peer, _ := netip.AddrFromSlice(ctx.RemoteIP())
	peer = peer.Unmap()
	if t.trusts(peer) {
		if xff := ctx.Request.Header.PeekCanonical(hdrForwardedFor); len(xff) > 0 {
			if i := bytes.LastIndexByte(xff, ','); i >= 0 {
				xff = xff[i+1:]
			}
			if a, err := netip.ParseAddr(text(bytes.TrimSpace(xff))); err == nil {
				peer = a.Unmap()
			}
		}
	}
	b := peer.As16()
	if peer.Is6() {
		clear(b[8:])
	}
	return maphash.Bytes(credSeed, b[:]) | 1
}

// tenantOf is a request's tenant in a concurrency queue: its
// credential's client when it is authenticated (authenticated), else its
// source (sourceOf), so credentials invented per request are one tenant.
func tenantOf(ctx *fasthttp.RequestCtx, t *table, key *clientKey) uint64 {
	if authenticated(t, key) {
		id, _ := credential(&ctx.Request.Header)
		return credHash(id)
	}
	return sourceOf(ctx, t)
}

// authenticated reports whether a request's credential was checked:
// auth.keys is on (t's), or client_keys_file lists its key (key).
func authenticated(t *table, key *clientKey) bool { return len(t.authKeys) > 0 || key != nil }
