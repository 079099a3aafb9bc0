package proxy

import (
	"errors"
	"slices"
	"sync/atomic"
)

// heldBytes is the budget of bytes Sturdy holds on behalf of clients, all
// requests together (server.max_buffered_bytes): a stream's head held
// past its first chunk (the commit point's framing, stream_hold), the
// text a rescue keeps, a body read whole for an HTTP/1.0 client. Each
// request reserves what it grows by and gives it all back when it ends.
// Past the budget a hold is released early (the stream is committed as
// it stands), a rescue becomes unrescuable and an HTTP/1.0 reply is
// 502 response_too_large.
type heldBytes struct {
	max  atomic.Int64 // hot-reloads
	used atomic.Int64
}

// take reserves n bytes; false, with nothing reserved, when that would
// pass the budget.
func (b *heldBytes) take(n int) bool {
	for {
		u := b.used.Load()
		if u+int64(n) > b.max.Load() {
			return false
		}
		if b.used.CompareAndSwap(u, u+int64(n)) {
			return true
		}
	}
}

// give returns n bytes reserved with take.
func (b *heldBytes) give(n int) { b.used.Add(-int64(n)) }

// The uses of the budget, as sturdy_buffer_full_total names them.
const (
	heldForHold   = "hold"
	heldForRescue = "rescue"
	heldForHTTP10 = "http10"
)

// errBuffersFull is why a read that would have grown a held buffer was
// not made: server.max_buffered_bytes is in use.
var errBuffersFull = errors.New("server.max_buffered_bytes is in use")

// hold reserves n more bytes of the budget for this request (given back
// in finish); false when the budget has no room, counted for use.
func (ex *exchange) hold(n int, use string) bool {
	if !ex.p.held.take(n) {
		ex.p.m.BufferFull.WithLabelValues(use).Inc()
		return false
	}
	ex.held += n
	return true
}

// headRoom makes room in the reply's head for at least one more byte
// (doubling it, to at most limit bytes), with every byte of its capacity
// past headSize reserved from the budget — a pooled head may come bigger
// than headSize from an earlier request (keepHead); false when the budget
// has no room.
func (ex *exchange) headRoom(limit int) bool {
	rp := &ex.reply
	want := cap(rp.head)
	if len(rp.head) == want {
		want += min(max(want, headSize), limit-len(rp.head))
	}
	if need := want - headSize - ex.headHeld; need > 0 {
		if !ex.hold(need, heldForHold) {
			return false
		}
		ex.headHeld += need
	}
	rp.head = slices.Grow(rp.head, want-len(rp.head))
	return true
}

// growHeld makes room in buf for at least one more byte (doubling it, to
// at most limit bytes in all), once this request's share of the budget
// agrees; errBuffersFull when it does not.
func (ex *exchange) growHeld(buf []byte, limit int, use string) ([]byte, error) {
	if len(buf) < cap(buf) {
		return buf, nil
	}
	more := min(max(cap(buf), headSize), limit-len(buf))
	if !ex.hold(more, use) {
		return buf, errBuffersFull
	}
	return slices.Grow(buf, more), nil
}
