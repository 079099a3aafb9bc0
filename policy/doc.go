// Package policy holds Sturdy's pure decisions: what an upstream attempt's
// outcome means (Classify), whether a request may be replayed (Replayable),
// how long to wait before the next attempt (Backoff, RetryAfter) and whether
// to try again at all (Retry.Next).
//
// Nothing here performs I/O, sleeps or reads the clock: callers pass in the
// facts (status, fault, time now, time left) and a source of randomness, so
// every decision is table-tested without timers.
package policy
