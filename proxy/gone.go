package proxy

import (
	"sync/atomic"

	"sturdy/listener"
	"sturdy/upstream"
)

// phase is where a request stands, for the access log and
// sturdy_client_gone_total when its client leaves.
type phase uint32

// The phases a request goes through.
const (
	phaseAdmit       phase = iota // read and admitted, not yet sent
	phaseQueue                    // waiting for a max_in_flight slot or a connection place
	phaseCooldown                 // waiting out a cooldown learned from a 429
	phasePacing                   // waiting for the rate limiter's turn
	phaseHead                     // an attempt waits for the upstream's response head
	phaseBackoff                  // waiting before a retry (Sturdy's backoff)
	phaseRetryAfter               // waiting before a retry (the upstream's Retry-After)
	phaseStream                   // the response is streaming
	phaseRideThrough              // waiting for an endpoint to come back (ride_through)
	phaseStreamHold               // a stream's head is held (stream_hold)
)

var phaseNames = [...]string{"admit", "queue", "cooldown", "pacing", "response_head", "backoff", "retry_after", "stream",
	"ride_through", "stream_hold"}

func (p phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return ""
}

// presence is whether the request's client is still there: its
// connection (nil outside Serve), where the request stands (phase), and
// once the watcher saw the client leave (left) where it stood then
// (gonePhase), a channel every wait ends on (goneCh, closed) and isGone
// set. inUse is what the request holds of the upstream connection in use
// (an attempt's, then the stream's), which the client's leaving closes
// (upstream.Hold.Sever).
type presence struct {
	cc               *listener.Conn
	goneCh           chan struct{}
	isGone           atomic.Bool
	phase, gonePhase atomic.Uint32
	inUse            upstream.Hold
}

// enter records the phase the request is in now.
func (c *presence) enter(p phase) { c.phase.Store(uint32(p)) }

// Left is the watcher's news that the client closed its connection:
// every wait ends (gone), no attempt or wait follows, and the upstream
// connection in use is closed — which is what makes vLLM, Ollama and
// llama.cpp stop generating. It runs on the watcher's goroutine, with the
// client connection's lock held, so the exchange is not released
// meanwhile.
func (c *presence) Left() {
	if c.isGone.Swap(true) {
		return
	}
	c.gonePhase.Store(c.phase.Load())
	close(c.goneCh)
	c.inUse.Sever()
}

// gone is closed when the client has left (see Left).
func (c *presence) gone() <-chan struct{} { return c.goneCh }
