package fleet

import (
	"context"
	"errors"
	"net"
	"syscall"
)

// The bounds of what a Redis reply may announce. go-redis allocates what
// a reply's header says (an array of 2,000,000,000 elements is a slice of
// that many), so a hostile or broken server could grow Sturdy to
// gigabytes with one line; Sturdy's own replies are a few small values.
const (
	// MaxReplyElements bounds the elements one reply announces, nested
	// aggregates' included (go-redis allocates each one's slice; a
	// map's pairs count twice).
	MaxReplyElements = 1 << 20
	// MaxReplyBulk bounds a bulk string, in bytes; maxReplyBytes all of
	// one reply's bulk strings together.
	MaxReplyBulk  = 1 << 20
	maxReplyBytes = 16 << 20
	// maxReplyLine bounds a reply line (a status, an error, a number, a
	// header).
	maxReplyLine = 64 << 10
)

// errReplyTooLarge fails a connection whose reply announced more than
// the bounds (or was not RESP at all).
var errReplyTooLarge = errors.New("redis: a reply past Sturdy's bounds (or not RESP)")

// guard wraps dial so every connection it opens is read through a RESP
// follower (replyGuard) before go-redis's reader sees a byte; failed
// hears of a dial that failed.
func guard(dial func(ctx context.Context, network, addr string) (net.Conn, error), failed func(error)) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			failed(err)
			return nil, err
		}
		g := &guardedConn{Conn: c}
		if sc, ok := c.(syscall.Conn); ok {
			return guardedSocket{g, sc}, nil
		}
		return g, nil
	}
}

// guardedConn is a Redis connection whose replies are followed as they
// are read: one that announces too much fails the read, with none of its
// bytes handed on.
type guardedConn struct {
	net.Conn
	g replyGuard
}

// guardedSocket is a guardedConn over a plain socket: its SyscallConn is
// the socket's, so go-redis's pool can still check an idle connection for
// a close (it peeks at the socket, never feeding its reader). Over TLS
// there is none, as with go-redis's own connections.
type guardedSocket struct {
	*guardedConn
	sc syscall.Conn
}

func (c guardedSocket) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }

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
// type, its number so far), or skipping a bulk payload; and, for the
// top-level reply being read, how many nested replies are still to come
// and what it announced so far.
type replyGuard struct {
	inLine  bool
	typ     byte
	num     int64
	neg     bool
	lineLen int
	skip    int64 // payload bytes (and their CRLF) still to pass
	// left counts the replies still to come inside the top-level reply
	// (0: the next one is a top-level reply); elements and bytes are what
	// it announced so far.
	left, elements, bytes int64
	err                   error
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
// and what the top-level reply announced so far — elements of all its
// aggregates, bytes of all its bulks — checked.
func (g *replyGuard) endLine() {
	if g.left == 0 {
		g.elements, g.bytes = 0, 0 // a top-level reply begins
	} else {
		g.left--
	}
	if g.neg { // -1: null
		return
	}
	n := g.num
	switch g.typ {
	case '$', '=', '!': // bulk string, verbatim string, bulk error
		g.bytes += n
		if n > MaxReplyBulk || g.bytes > maxReplyBytes {
			g.err = errReplyTooLarge
		}
		g.skip = n + 2
		return
	case '%', '|': // map, attribute: pairs
		n *= 2
	case '*', '~', '>': // array, set, push
	default:
		return
	}
	g.elements += n
	g.left += n
	if g.elements > MaxReplyElements {
		g.err = errReplyTooLarge
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
