package listener

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Conn is a client connection: each Write may block at most the Guard's
// WriteTimeout, closing it frees its place under MaxConnections, and when
// the client leaves (the watcher sees its peer close) the request it is
// serving is told.
type Conn struct {
	net.Conn
	l      *Guard
	closed atomic.Bool
	// fd and watched: its place in the watcher's set (set once, at accept).
	fd      int32
	watched bool
	// mu guards serving, the request being served, and gone.
	mu      sync.Mutex
	serving Leaver
	gone    bool
	// deadline is the write deadline last set (UnixNano), written only by
	// the connection's writes (one at a time).
	deadline int64
	// path is the path of the last request whose first bytes a read
	// brought (pathLen of it): a request fasthttp cannot read is answered
	// in its path's API's shape. Read and used on the connection's
	// goroutine only.
	path    [maxNotedPath]byte
	pathLen int
}

// maxNotedPath bounds the path a Conn notes: the API paths are short; a
// longer one is no API's.
const maxNotedPath = 64

// Read notes the path of a request whose first bytes it read: a method,
// a space, a path.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 8 && b[0] >= 'A' && b[0] <= 'Z' { // a method's first letter: a request may begin
		if sp := bytes.IndexByte(b[:8], ' '); sp >= 3 && b[sp+1] == '/' {
			p := b[sp+1 : min(n, sp+1+maxNotedPath)]
			if end := bytes.IndexAny(p, " ?#\r\n"); end >= 0 {
				p = p[:end]
			}
			c.pathLen = copy(c.path[:], p)
		}
	}
	return n, err
}

// Write bounds each write by write_timeout. The deadline is moved on
// only once a tenth of it has passed since it was last set: a write
// always has at least 90 % of write_timeout, and a connection writing
// back to back (a stream, keep-alive replies) does not re-arm the
// runtime's timer on every write.
func (c *Conn) Write(b []byte) (int, error) {
	now := time.Now().UnixNano()
	if wt := int64(c.l.cfg.WriteTimeout); now+wt-c.deadline > wt/10 {
		if err := c.Conn.SetWriteDeadline(time.Unix(0, now+wt)); err != nil {
			return 0, err
		}
		c.deadline = now + wt
	}
	return c.Conn.Write(b)
}

// Close frees the connection's place, once, and closes it.
func (c *Conn) Close() error {
	if !c.closed.Swap(true) {
		unwatch(c)
		c.l.open.Add(-1)
		c.l.cfg.Closed()
	}
	return c.Conn.Close()
}

// ConnOf finds the Conn under the connection fasthttp serves (a
// *tls.Conn wraps it); nil when there is none.
func ConnOf(c net.Conn) *Conn {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	cc, _ := c.(*Conn)
	return cc
}

// NotedPath is the path of the last request that began on c's connection
// (nil: none noted, or a connection no Guard accepted).
func NotedPath(c net.Conn) []byte {
	if cc := ConnOf(c); cc != nil {
		return cc.path[:cc.pathLen]
	}
	return nil
}
