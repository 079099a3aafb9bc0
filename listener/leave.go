package listener

// Leaver is told, once, that the client of the request it stands for
// closed its connection. Left runs with the connection's lock held, so
// the request is not released meanwhile: on the watcher's goroutine, or
// on the request's own when it starts on a connection already left.
type Leaver interface{ Left() }

// Serving makes r the request told if the client leaves (nil: none); a
// request that starts on a connection already left is told at once.
func (c *Conn) Serving(r Leaver) {
	c.mu.Lock()
	c.serving = r
	if r != nil && c.gone {
		r.Left()
	}
	c.mu.Unlock()
}

// left is the watcher's news that the peer closed. Only the first tells:
// a write to the closed peer can raise another event.
func (c *Conn) left() {
	c.mu.Lock()
	if !c.gone {
		c.gone = true
		if c.serving != nil {
			c.serving.Left()
		}
	}
	c.mu.Unlock()
}
