package policy

import (
	"sync"
	"time"
)

// budgetWindow is the span a retry budget looks back over.
const budgetWindow = 10 * time.Second

// Budget caps the retries sent to one upstream (the Finagle/Envoy retry
// budget): within the last 10 s, retries may add at most Ratio of the
// first attempts plus MinPerSecond per second. A 20 % transient fault rate
// needs ≈ 0.25 retries per request and is absorbed; during an outage the
// retries cannot push the load above (1 + Ratio)× plus a constant.
//
// Budget keeps state but does no I/O and reads no clock: callers pass the
// time, so it is tested without sleeping. It is safe for concurrent use.
type Budget struct {
	// Ratio of first attempts that may be retried.
	Ratio float64
	// MinPerSecond retries are always allowed.
	MinPerSecond float64

	mu      sync.Mutex
	buckets [10]budgetBucket // one per second of the window
}

type budgetBucket struct {
	second          int64
	firsts, retries float64
}

// bucket returns the bucket for now, cleared if it held an older second.
func (b *Budget) bucket(now time.Time) *budgetBucket {
	sec := now.Unix()
	bk := &b.buckets[sec%int64(len(b.buckets))]
	if bk.second != sec {
		*bk = budgetBucket{second: sec}
	}
	return bk
}

// FirstAttempt records a first attempt on the upstream.
func (b *Budget) FirstAttempt(now time.Time) {
	b.mu.Lock()
	b.bucket(now).firsts++
	b.mu.Unlock()
}

// Reserve takes one retry from the budget if one is left now, and reports
// whether it did. The caller decides (Retry.Decide, told whether the
// budget had one) and gives the retry back with Cancel when it does not
// send it. Taking before deciding keeps the cap exact under concurrency.
func (b *Budget) Reserve(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	var firsts, retries float64
	oldest := now.Unix() - int64(len(b.buckets)) + 1
	for i := range b.buckets {
		if bk := &b.buckets[i]; bk.second >= oldest {
			firsts += bk.firsts
			retries += bk.retries
		}
	}
	if retries+1 > b.Ratio*firsts+b.MinPerSecond*budgetWindow.Seconds() {
		return false
	}
	b.bucket(now).retries++
	return true
}

// Cancel gives back a retry Reserve took at now and that was not sent.
func (b *Budget) Cancel(now time.Time) {
	b.mu.Lock()
	if bk := b.bucket(now); bk.retries > 0 {
		bk.retries--
	}
	b.mu.Unlock()
}
