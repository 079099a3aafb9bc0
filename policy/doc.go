// Package policy holds Sturdy's pure decisions: what an upstream attempt's
// outcome means (Classify), whether a request may be replayed (Replayable),
// how long to wait before the next attempt (Backoff, RetryAfter), what
// follows an attempt (Retry.Decide: retry in place, fail over or stop, with
// the wait and the reason), what an obstacle before an attempt means
// (Clear: wait, fail over or refuse), how many retries an upstream may
// take (Budget), and how many tokens a budget admits (TokenWindow).
//
// Nothing here performs I/O, sleeps or reads the clock: callers pass in the
// facts (status, fault, time now, time left) and a source of randomness, so
// every decision is table-tested without timers.
//
// The files, and what each decides:
//
//	classify.go    Classify: an attempt's Outcome → Verdict (class, reason, what each breaker hears; Label);
//	               Overloaded (an adaptive limit's backoff) and Verdict.ReplyHealth (a 503/529 to the limit, not the breaker)
//	decide.go      Retry.Decide after an attempt (DecideStale: a stale connection's replay); Clear before one (an Obstacle at a Gate)
//	retry.go       Retry (a route's policy, WithDefaults), RetryOn, full-jitter Backoff
//	stop.go        Stop: why the loop stopped, as logged and as said to the client
//	retryafter.go  RetryAfter (retry-after-ms, Retry-After), InsufficientQuota
//	api.go         CallOf: what a path calls (API, inference or not, operation name), the one list of API paths;
//	               APIOf, Replayable: which requests may be sent twice
//	budget.go      Budget: the retry budget per upstream
//	tokens.go      TokenWindow: a token budget a minute (reserve, settle, refund; debt, never forgiven);
//	               what a request reserves: RequestTokens (its text, tools and max output, per API), EstimateTokens
//	origin.go      LocalHost, LocalOrigin: what may reach a loopback address; CORSAllowed
//	text.go        TextBytes: the bytes of a request's text, in one pass (MaxTextDepth bounds how deep); Fields
//	usage.go       ReadUsage: the tokens a reply says it used, by its API's rules (Anthropic's cached input counted)
//	commit.go      Judge: a stream event before the commit point; EventFailure
//	rescue.go      Continuable, FollowChunk (chat), ContinuableMessages, FollowMessage (the Messages
//	               API): whether a cut stream may be continued; Rescue.Refusal,
//	               RescueNext: whether it is continued now, and where next
//	pick.go        PickLeastRequests, PickRoundRobin, PickAffinity; KeyHash
//	match.go       GlobMatch, GlobSpecificity, ClientTimeout, RequestedRetries, RateLimitExhausted
//	model.go       ModelKey: a client's model name, bounded, as Sturdy keys and shows it; RuneCut
package policy
