// Package policy holds Sturdy's pure decisions: what an upstream attempt's
// outcome means (Classify), whether a request may be replayed (Replayable),
// how long to wait before the next attempt (Backoff, RetryAfter), what
// follows an attempt (Retry.Decide: retry in place, fail over or stop, with
// the wait and the reason), what an obstacle before an attempt means
// (Clear: wait, fail over or refuse), and how many retries an upstream may
// take (Budget).
//
// Nothing here performs I/O, sleeps or reads the clock: callers pass in the
// facts (status, fault, time now, time left) and a source of randomness, so
// every decision is table-tested without timers.
package policy
