package proxy

import (
	"strconv"
	"strings"
	"testing"
)

// TestTheFailureRingKeepsTheNewestFailures: only failures Sturdy or an
// upstream owns are listed, at most MaxListedFailures, newest first, with
// their strings copied (a summary's alias the exchange, reused next) and
// a long path cut.
func TestTheFailureRingKeepsTheNewestFailures(t *testing.T) {
	t.Parallel()
	var p Proxy
	for _, outcome := range []string{outcomeOK, outcomePassThrough, outcomeRejected, outcomeUnauthorized, outcomeClientGone,
		outcomeRateLimited} { // a 429 before routing: the client's own clients: limit
		p.failures.record(&summary{outcome: outcome, id: []byte("x")})
	}
	if n := len(p.Failures()); n != 0 {
		t.Fatalf("%d requests that did not fail were listed", n)
	}
	id := []byte("req-0")
	long := []byte("/" + strings.Repeat("p", 10_000))
	for i := range MaxListedFailures + 7 {
		id = strconv.AppendInt(id[:4], int64(i), 10)
		p.failures.record(&summary{outcome: outcomeExhausted, id: id, path: long, status: 503,
			targets: []targetNote{{upstream: "u", attempts: 2, result: "5xx"}}})
	}
	p.failures.record(&summary{outcome: outcomeRateLimited, id: []byte("cooling"), rt: &route{}, targets: []targetNote{{upstream: "u", result: "cooldown"}}})
	if got := p.Failures(); got[0].ID != "cooling" {
		t.Fatalf("a 429 of every target's cooldown is not listed: %+v", got[0])
	}
	id[4] = 'X' // the exchange's memory, reused: what was listed must not change
	got := p.Failures()
	if len(got) != MaxListedFailures || got[1].ID != "req-"+strconv.Itoa(MaxListedFailures+6) || got[len(got)-1].ID != "req-8" {
		t.Fatalf("listed %d, first %q, last %q", len(got), got[0].ID, got[len(got)-1].ID)
	}
	if len(got[1].Path) != maxFailurePath || len(got[1].Targets) != 1 || got[1].Targets[0].Result != "5xx" {
		t.Fatalf("listed %+v", got[1])
	}
}
