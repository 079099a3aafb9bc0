package fleet

import (
	"context"
	"errors"
	"net"
)

// The bounds of what a Redis reply may announce. go-redis allocates what
// a reply's header says (an array of 2,000,000,000 elements is a slice of
// that many), so a hostile or broken server could grow Sturdy to
// gigabytes with one line; Sturdy's own replies are a few small values.
const (
	// MaxReplyElements bounds an aggregate's elements (an array's; a
	// map's pairs count twice).
	MaxReplyElements = 1 << 20
	// MaxReplyBulk bounds a bulk string, in bytes.
	MaxReplyBulk = 1 << 20
	// maxReplyLine bounds a reply line (a status, an error, a number, a
	// header).
	maxReplyLine = 64 << 10
)

// errReplyTooLarge fails a connection whose reply announced more than
// the bounds (or was not RESP at all).
var errReplyTooLarge = errors.New("redis: a reply past Sturdy's bounds (or not RESP)")

// guard wraps dial so every connection it opens is read through a RESP
// follower (replyGuard) before go-redis's reader sees a byte.
func guard(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &guardedConn{Conn: c}, nil
	}
}

// guardedConn is a Redis connection whose replies are followed as they
// are read: one that announces too much fails the read, with none of its
// bytes handed on.
type guardedConn struct {
	net.Conn
	g replyGuard
}

func (c *guardedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.g.err == nil {
		c.g.feed(p[:n])
	}
	if c.g.err != nil {
		return 0, c.g.err
	}
	return n, err
}

// replyGuard follows a stream of RESP2 (and RESP3) replies — type byte,
// header line, payload — keeping only where it stands: inside a line (its
// type, its number so far), or skipping a bulk payload.
type replyGuard struct {
	inLine  bool
	typ     byte
	num     int64
	neg     bool
	lineLen int
	skip    int64 // payload bytes (and their CRLF) still to pass
	err     error
}

// feed follows b; err is set at the first reply past the bounds.
func (g *replyGuard) feed(b []byte) {
	for len(b) > 0 && g.err == nil {
		if g.skip > 0 {
			n := min(g.skip, int64(len(b)))
			g.skip -= n
			b = b[n:]
			continue
		}
		c := b[0]
		b = b[1:]
		if !g.inLine {
			g.inLine, g.typ, g.num, g.neg, g.lineLen = true, c, 0, false, 0
			if !knownType(c) {
				g.err = errReplyTooLarge
			}
			continue
		}
		if g.lineLen++; g.lineLen > maxReplyLine {
			g.err = errReplyTooLarge
			return
		}
		switch {
		case c == '\n':
			g.inLine = false
			g.endLine()
		case !counted(g.typ) || c == '\r':
		case c == '-' && g.lineLen == 1:
			g.neg = true
		case c >= '0' && c <= '9':
			if g.num = g.num*10 + int64(c-'0'); g.num > 1<<40 {
				g.err = errReplyTooLarge
			}
		default:
			g.err = errReplyTooLarge // a length that is not a number
		}
	}
}

// endLine acts on a header line just ended: a bulk's payload is skipped,
// and an aggregate's or bulk's announced size checked.
func (g *replyGuard) endLine() {
	if g.neg { // -1: null
		return
	}
	switch g.typ {
	case '$', '=', '!': // bulk string, verbatim string, bulk error
		if g.num > MaxReplyBulk {
			g.err = errReplyTooLarge
		}
		g.skip = g.num + 2
	case '*', '~', '>': // array, set, push
		if g.num > MaxReplyElements {
			g.err = errReplyTooLarge
		}
	case '%', '|': // map, attribute: pairs
		if 2*g.num > MaxReplyElements {
			g.err = errReplyTooLarge
		}
	}
}

// knownType reports whether c starts a RESP2 or RESP3 reply.
func knownType(c byte) bool {
	switch c {
	case '+', '-', ':', '$', '*', '_', ',', '#', '(', '=', '!', '%', '~', '>', '|':
		return true
	}
	return false
}

// counted reports whether a reply type's line is a count or a length.
func counted(t byte) bool {
	switch t {
	case '$', '=', '!', '*', '~', '>', '%', '|':
		return true
	}
	return false
}
