package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// upstreamTransport is the round trip of every endpoint's HostClient:
// fasthttp's own (DefaultTransport), except that it looks at the response
// head before it decides how to read the body. A body whose
// Content-Length fits the head Sturdy holds before committing (HeadSize)
// is read whole, under the attempt's deadline, and the connection goes
// back to the pool at once — the attempt would read all of it before
// committing anyway. Any other body (chunked, close-delimited, larger) is
// streamed through a streamedBody. fasthttp's transport decides before
// the head arrives, so it streams every reply (four allocations each).
//
// It serves clients that leave MaxConnDuration, ReadTimeout,
// WriteTimeout and DisableHeaderNamesNormalizing unset, as the
// endpoints' are; the request's timeout (DoTimeout) bounds the wait for
// a connection, the write and the response head together (and a small
// body read with its head).
type upstreamTransport struct{}

// HeadSize is how much of a response body the request path holds before
// committing: a whole small body (most JSON replies), or the first chunk
// of a stream. A body of known length up to it is read with its head.
const HeadSize = 32 << 10

// MaxInterimResponses bounds the 1xx responses read before the final one.
const MaxInterimResponses = 100

// errTooManyInterim fails a response head preceded by more than
// MaxInterimResponses interim ones.
var errTooManyInterim = errors.New("upstream sent too many 1xx responses")

// RoundTrip sends req on a connection of hc and reads the response head,
// and the body too when it is small and of known length (readBody).
func (upstreamTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (retry bool, err error) {
	// One deadline from before the connection is taken: waiting for it,
	// dialling it, the write and the head all count against the attempt.
	timeout := req.GetTimeOut()
	var deadline time.Time // zero: none
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	cc, err := hc.AcquireConn(timeout, req.ConnectionClose())
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	resp.ParseNetConn(conn)
	if err := writeRequest(hc, conn, req, deadline); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	if req.Header.IsHead() {
		resp.SkipBody = true
	}
	br := hc.AcquireReader(conn)
	if err := readResponseHead(resp, br); err != nil {
		hc.ReleaseReader(br)
		hc.CloseConn(cc)
		return true, err
	}
	return false, readBody(hc, cc, conn, br, req, resp)
}

// writeRequest writes req on conn by deadline (a write timeout is
// fasthttp's ErrTimeout) and sets the same deadline for the response.
func writeRequest(hc *fasthttp.HostClient, conn net.Conn, req *fasthttp.Request, deadline time.Time) error {
	if err := conn.SetWriteDeadline(deadline); err != nil {
		return &unsent{err}
	}
	bw := hc.AcquireWriter(conn)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	hc.ReleaseWriter(bw)
	if err != nil {
		if IsTimeout(err) {
			err = fasthttp.ErrTimeout
		}
		return err
	}
	return conn.SetReadDeadline(deadline)
}

// readBody reads the body of the response whose head resp holds: none,
// whole when its Content-Length fits HeadSize (the connection then goes
// back to the pool, or is closed, at once), else as a streamedBody that
// gives the connection (cc, fasthttp's) back when it is closed.
func readBody(hc *fasthttp.HostClient, cc any, conn net.Conn, br *bufio.Reader, req *fasthttp.Request, resp *fasthttp.Response) error {
	keep := !req.ConnectionClose() && !resp.ConnectionClose()
	cl := resp.Header.ContentLength()
	switch {
	case skipsBody(resp):
	case cl >= 0 && cl <= HeadSize:
		resp.StreamBody = false
		err := resp.ReadBody(br, HeadSize)
		resp.StreamBody = true
		if err != nil {
			hc.ReleaseReader(br)
			closeConn(hc, cc)
			return err
		}
	default:
		body := &streamedBody{br: br, conn: conn, uc: connOf(resp), hc: hc, cc: cc, resp: resp, left: int64(cl), keep: keep && cl != -2}
		if cl == -1 {
			body.chunks = httputil.NewChunkedReader(br)
		}
		resp.SetBodyStream(body, cl)
		return nil
	}
	hc.ReleaseReader(br)
	// Done with before the attempt returns: the Hold of the connection
	// lets go of it first, or a client leaving meanwhile would close it
	// under the request it serves next; one closed already is not pooled.
	if !connOf(resp).reusable() {
		keep = false
	}
	if keep {
		releaseConn(hc, cc)
	} else {
		closeConn(hc, cc)
	}
	return nil
}

// readResponseHead reads the final response head from br, skipping
// interim (1xx) ones, as fasthttp's Response.ReadLimitBody does.
func readResponseHead(resp *fasthttp.Response, br *bufio.Reader) error {
	resp.ResetBody()
	if err := readHeader(&resp.Header, br); err != nil {
		return err
	}
	for n := 0; ; n++ {
		if s := resp.StatusCode(); s < 100 || s > 199 || s == fasthttp.StatusSwitchingProtocols {
			return nil
		}
		if n >= MaxInterimResponses {
			return errTooManyInterim
		}
		if err := readHeader(&resp.Header, br); err != nil {
			return err
		}
	}
}

// readHeader reads one response head. fasthttp refuses a head that
// announces a trailer field it forbids (Set-Cookie, Content-Type …),
// failing a valid reply; such a head is read again without its Trailer
// fields — Sturdy forwards no trailers (discardTrailer) and drops Trailer
// as hop-by-hop anyway.
func readHeader(h *fasthttp.ResponseHeader, br *bufio.Reader) error {
	err := h.Read(br)
	if !errors.Is(err, fasthttp.ErrBadTrailer) {
		return err
	}
	b, _ := br.Peek(br.Buffered()) // the whole head is buffered: fasthttp parses only a complete one
	end := headEnd(b)
	if end < 0 {
		return err
	}
	stripped := withoutTrailerFields(b[:end])
	if err := h.Read(bufio.NewReaderSize(bytes.NewReader(stripped), max(len(stripped), 4096))); err != nil {
		return err
	}
	_, _ = br.Discard(end)
	return nil
}

// headEnd returns the length of the response head at the start of b, up
// to and with its blank line; -1 when b holds none.
func headEnd(b []byte) int {
	crlf, lf := bytes.Index(b, []byte("\r\n\r\n")), bytes.Index(b, []byte("\n\n"))
	switch {
	case crlf >= 0 && (lf < 0 || crlf < lf):
		return crlf + 4
	case lf >= 0:
		return lf + 2
	}
	return -1
}

// withoutTrailerFields copies a response head without its Trailer lines.
func withoutTrailerFields(head []byte) []byte {
	out := make([]byte, 0, len(head))
	for rest := head; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line = rest[:i+1]
		}
		rest = rest[len(line):]
		if name, _, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(bytes.TrimSpace(name), []byte("Trailer")) {
			continue
		}
		out = append(out, line...)
	}
	return out
}

// skipsBody reports whether resp has no body: a HEAD's, a 1xx, 204 or 304.
func skipsBody(resp *fasthttp.Response) bool {
	s := resp.StatusCode()
	return resp.SkipBody || (s >= 100 && s < 200) || s == fasthttp.StatusNoContent || s == fasthttp.StatusNotModified
}

// streamedBody is an upstream response body read as it arrives: of known
// length (left counts what is still to come), chunked (chunks decodes
// it: one Read takes every chunk already received, without waiting for
// the next) or delimited by the connection's close (left is -2). Closing
// it gives the connection back to its pool when the body was read to its
// end on a keep-alive connection, and closes it otherwise. A Close while
// a Read is in flight (another goroutine's) interrupts it by closing the
// connection, then waits for it, as fasthttp's own streamed body does.
type streamedBody struct {
	br     *bufio.Reader
	conn   net.Conn
	uc     *upstreamConn // conn, or what it wraps (TLS); nil when not Sturdy's
	hc     *fasthttp.HostClient
	cc     any // fasthttp's *clientConn, whose type is not exported
	resp   *fasthttp.Response
	chunks io.Reader
	left   int64
	// keep says the connection may serve another request once the body
	// is read to its end (ended); failed that a read failed.
	keep, ended, failed bool
	closed              atomic.Bool
	readMu              sync.Mutex
	closeOnce           sync.Once
}

// Read reads the body's next bytes; io.EOF, alone, once it has ended.
func (b *streamedBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, io.ErrClosedPipe
	}
	b.readMu.Lock()
	defer b.readMu.Unlock()
	if b.closed.Load() {
		return 0, io.ErrClosedPipe
	}
	if b.ended {
		return 0, io.EOF
	}
	n, err := b.read(p)
	switch {
	case err == io.EOF && n > 0:
		// The end comes alone, on the next Read: a reader judges the last
		// bytes before it learns of the end.
		b.ended = true
		return n, nil
	case err == io.EOF:
		b.ended = true
	case err != nil:
		b.failed = true
	}
	return n, err
}

// read reads the next bytes by the body's framing; Read keeps the state
// around it (ended, failed, the lock).
func (b *streamedBody) read(p []byte) (int, error) {
	switch {
	case b.chunks != nil:
		n, err := b.chunks.Read(p)
		if err == io.EOF {
			// The last chunk: its trailer section (usually empty) ends the
			// body; a body cut there, or a trailer past the bound, is broken.
			if terr := discardTrailer(b.br); terr != nil {
				return n, terr
			}
		}
		return n, err
	case b.left >= 0:
		if b.left == 0 {
			return 0, io.EOF
		}
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err := b.br.Read(p)
		b.left -= int64(n)
		switch {
		case err == io.EOF:
			return n, io.ErrUnexpectedEOF // shorter than its Content-Length
		case err == nil && b.left == 0:
			return n, io.EOF
		}
		return n, err
	default:
		return b.br.Read(p)
	}
}

// CloseWithError ends the body's use: the connection goes back to the
// pool only when the body was read to its end without error, and the
// connection is still open.
func (b *streamedBody) CloseWithError(err error) error {
	b.closeOnce.Do(func() {
		b.closed.Store(true)
		locked := b.readMu.TryLock()
		if !locked {
			_ = b.conn.Close() // unblock the Read in flight
			b.readMu.Lock()
		}
		defer b.readMu.Unlock()
		b.hc.ReleaseReader(b.br)
		// A client that left as the body ended may have closed the
		// connection (Hold.Sever) before its request let go of it: that
		// one is not pooled either (reusable).
		reusable := b.uc.reusable()
		if locked && err == nil && b.ended && !b.failed && b.keep && !b.resp.ConnectionClose() && reusable {
			releaseConn(b.hc, b.cc)
		} else {
			closeConn(b.hc, b.cc)
		}
	})
	return nil
}

// MaxTrailerBytes bounds the trailer section read after a chunked body's
// last chunk.
const MaxTrailerBytes = 8 << 10

// errTrailerTooLarge fails a chunked body whose trailer section passes
// MaxTrailerBytes.
var errTrailerTooLarge = errors.New("upstream trailer section over 8 KiB")

// discardTrailer reads the trailer section that ends a chunked body —
// field lines up to an empty one — and drops it: Sturdy forwards no
// trailers (fasthttp's own reader merged them into the response's
// headers, and refused valid fields such as Set-Cookie, failing a good
// reply). Past MaxTrailerBytes, or cut before its end, it is an error.
func discardTrailer(br *bufio.Reader) error {
	read, partial := 0, false
	for {
		line, err := br.ReadSlice('\n')
		if read += len(line); read > MaxTrailerBytes {
			return errTrailerTooLarge
		}
		switch {
		case err == bufio.ErrBufferFull: // a line longer than the buffer: the rest follows
			partial = true
			continue
		case err == io.EOF:
			return io.ErrUnexpectedEOF
		case err != nil:
			return err
		}
		if !partial && len(bytes.TrimRight(line, "\r\n")) == 0 {
			return nil
		}
		partial = false
	}
}

// pooledConn gives fasthttp's connection methods a use of the connection
// held as an any: its type is not exported, so only a type parameter can
// name it.
func pooledConn[C any](f func(*fasthttp.HostClient, C)) func(*fasthttp.HostClient, any) {
	return func(hc *fasthttp.HostClient, cc any) { f(hc, cc.(C)) }
}

var (
	releaseConn = pooledConn((*fasthttp.HostClient).ReleaseConn)
	closeConn   = pooledConn((*fasthttp.HostClient).CloseConn)
)
