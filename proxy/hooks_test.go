package proxy

import (
	"sync"
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
)

// recordingHook counts what it reserved; it refuses while refuse is set.
type recordingHook struct {
	mu       sync.Mutex
	refuse   bool
	reserved int
}

func (h *recordingHook) reserve(ex *exchange, _ time.Time) *apiError {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refuse {
		ex.out.outcome = outcomeRateLimited
		return newError(CodeRateLimited, "a test hook refused")
	}
	h.reserved++
	return nil
}

// TestHooksReserveBeforeTheLoop: each hook's reserve runs at admission,
// in order; a refusal is the client's answer, and no upstream sees the
// request.
func TestHooksReserveBeforeTheLoop(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: `{"ok":true}`})
	h := startProxy(t, up.URL, nil)
	first, second := &recordingHook{}, &recordingHook{}
	h.p.tbl.Load().hooks = []hook{first, second} // before any request
	if resp, _ := h.chat(`{"model":"m"}`); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	second.mu.Lock()
	second.refuse = true
	second.mu.Unlock()
	if resp, _ := h.chat(`{"model":"m"}`); resp.StatusCode != 429 {
		t.Fatalf("a refusing hook: status %d", resp.StatusCode)
	}
	first.mu.Lock()
	defer first.mu.Unlock()
	second.mu.Lock()
	defer second.mu.Unlock()
	if first.reserved != 2 || second.reserved != 1 {
		t.Fatalf("reserved %d and %d, want 2 and 1", first.reserved, second.reserved)
	}
	if up.Count() != 1 {
		t.Fatalf("the upstream saw %d requests, want 1", up.Count())
	}
}
