package proxy

import (
	"sync"
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
)

// recordingHook records what it reserved and how each request settled;
// it refuses while refuse is set.
type recordingHook struct {
	mu       sync.Mutex
	refuse   bool
	reserved int
	settled  []string // outcome/status of each settled request
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

func (h *recordingHook) settle(_ *exchange, s summary) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.settled = append(h.settled, s.outcome)
}

// TestHooksReserveBeforeTheLoopAndSettleAfterIt: a hook's reserve runs at
// admission and its settle once the request has ended, with its summary;
// a refusal is the client's answer, and only the hooks whose reserve
// passed are settled.
func TestHooksReserveBeforeTheLoopAndSettleAfterIt(t *testing.T) {
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
	h.accessLines(2) // both requests have ended; settle follows the access line
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		first.mu.Lock()
		n := len(first.settled)
		first.mu.Unlock()
		if n == 2 {
			break
		}
	}
	first.mu.Lock()
	defer first.mu.Unlock()
	second.mu.Lock()
	defer second.mu.Unlock()
	if first.reserved != 2 || len(first.settled) != 2 || first.settled[0] != outcomeOK || first.settled[1] != outcomeRateLimited {
		t.Fatalf("the first hook: reserved %d, settled %v", first.reserved, first.settled)
	}
	if second.reserved != 1 || len(second.settled) != 1 || second.settled[0] != outcomeOK {
		t.Fatalf("the refusing hook: reserved %d, settled %v", second.reserved, second.settled)
	}
	if up.Count() != 1 {
		t.Fatalf("the upstream saw %d requests, want 1", up.Count())
	}
}
