package policy

// Stop says why the attempt loop stops trying (StopNone: it does not, or
// nothing was tried).
type Stop uint8

// The reasons to stop trying. Each has a name (logs, metrics) and a text
// (the client's error message); see String and Text.
const (
	StopNone Stop = iota
	// StopFinal: the outcome is not a failure to retry (success,
	// pass-through, client gone).
	StopFinal
	// StopNotOn: the failure's reason is not in `retry.on`.
	StopNotOn
	// StopNotReplayable: the request may have reached the upstream and is
	// not safe to send twice.
	StopNotReplayable
	// StopMaxAttempts: max_attempts reached.
	StopMaxAttempts
	// StopMaxTotalAttempts: max_total_attempts reached (across targets).
	StopMaxTotalAttempts
	// StopRetryAfterTooLong: the server asked for a wait above
	// max_retry_after.
	StopRetryAfterTooLong
	// StopDeadline: the wait would pass the request's deadline.
	StopDeadline
	// StopBreakerOpen: the upstream's breaker opened between attempts.
	StopBreakerOpen
	// StopBudget: the upstream's retry budget is spent.
	StopBudget
	// StopUnavailable: no target is left to try (breakers open, cooling
	// down after a 429, rate-limited or busy).
	StopUnavailable
	// StopShutdown: Sturdy is shutting down; a wait ended early.
	StopShutdown
	// StopClientGone: the client went away.
	StopClientGone
)

// stops names each Stop for logs and metrics, and says it for people.
var stops = [...]struct{ name, text string }{
	StopNone:              {"", ""},
	StopFinal:             {"final", ""},
	StopNotOn:             {"not_in_retry_on", "not in retry.on"},
	StopNotReplayable:     {"not_replayable", "request not safe to replay"},
	StopMaxAttempts:       {"max_attempts", "max_attempts reached"},
	StopMaxTotalAttempts:  {"max_total_attempts", "max_total_attempts reached"},
	StopRetryAfterTooLong: {"retry_after_too_long", "the upstream asked to wait longer than max_retry_after"},
	StopDeadline:          {"deadline", "deadline reached"},
	StopBreakerOpen:       {"breaker_open", "circuit breaker opened"},
	StopBudget:            {"retry_budget", "retry budget spent"},
	StopUnavailable:       {"no_target_available", "no target left"},
	StopShutdown:          {"shutting_down", "Sturdy is shutting down"},
	StopClientGone:        {"client_gone", "the client went away"},
}

// String returns the stop reason as logged and in the retry-stops metric.
func (s Stop) String() string {
	if int(s) < len(stops) {
		return stops[s].name
	}
	return ""
}

// Text says the stop reason in words for an error message ("" for
// StopNone and StopFinal).
func (s Stop) Text() string {
	if int(s) < len(stops) {
		return stops[s].text
	}
	return ""
}

// Ended reports whether retrying ended early for this reason: every stop
// but StopNone and StopFinal. Only these are logged and counted.
func (s Stop) Ended() bool { return s != StopNone && s != StopFinal }
