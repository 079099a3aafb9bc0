//go:build linux

package listener

import (
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// watcher notices clients that leave: every client connection's socket is
// in one epoll set, watched for the peer closing (EPOLLRDHUP, EPOLLHUP,
// EPOLLERR) by one goroutine — no goroutine, timer or syscall per
// request, two epoll_ctl calls per connection. It reads no data, so
// keep-alive and pipelined requests are untouched, and a TLS connection
// (the same socket) is watched alike.
type watcher struct {
	epfd  int
	mu    sync.Mutex
	gen   int32
	conns map[int32]watched // by descriptor
}

// watched is a connection in the set; gen tells it from a later
// connection that reuses its descriptor.
type watched struct {
	conn *Conn
	gen  int32
}

var (
	watchOnce sync.Once
	theWatch  *watcher // nil when epoll is unavailable: nothing is watched
)

// clientWatch returns the process's watcher, started on first use.
func clientWatch() *watcher {
	watchOnce.Do(func() {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		theWatch = &watcher{epfd: fd, conns: map[int32]watched{}}
		go theWatch.loop()
	})
	return theWatch
}

// WatchClients turns the watch off for a benchmark's comparison.
var WatchClients = true

// watch adds c's socket to the set, when it has one.
func watch(c *Conn) {
	if !WatchClients {
		return
	}
	w := clientWatch()
	sc, ok := c.Conn.(syscall.Conn)
	if w == nil || !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.gen++
		ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd), Pad: w.gen}
		if unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev) == nil {
			w.conns[int32(fd)] = watched{conn: c, gen: w.gen}
			c.fd = int32(fd)
			c.watched = true
		}
	})
}

// unwatch takes c's socket out of the set; it runs before the socket is
// closed, so its descriptor is never mistaken for a later connection's.
func unwatch(c *Conn) {
	if !c.watched {
		return
	}
	w := theWatch
	w.mu.Lock()
	if cur, ok := w.conns[c.fd]; ok && cur.conn == c {
		delete(w.conns, c.fd)
		_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, int(c.fd), nil)
	}
	w.mu.Unlock()
}

// loop tells each connection whose peer closed.
func (w *watcher) loop() {
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return
		}
		for _, ev := range events[:n] {
			w.mu.Lock()
			cur, ok := w.conns[ev.Fd]
			w.mu.Unlock()
			if ok && cur.gen == ev.Pad {
				cur.conn.left()
			}
		}
	}
}
