// Package proxy is Sturdy's fasthttp handler. A request goes through
// files named for their phase, and calls between files go one way (no
// file calls back into one that calls it: tools/shape's test holds it,
// `go run ./tools/shape` shows the shape). Handle admits and prepares,
// then runs the loop and responds (handler.go); a rescue is a caller of
// the loop's step, never called by it:
//
//	handler.go  admit, route, prepare   Handle → admit → prepare
//	loop.go     targets, gates          run → onTarget → visit.run (one visit per target: useTarget, then
//	                                    attemptOn: gate, choose, reserveTokens, send; then decide)
//	gates.go    obstacles and waits     visit.clear → policy.Clear → block (the loop's obstruction); visit.wait,
//	                                    interrupted, carry: what loop.go and pool.go both go through
//	pool.go     pick and lease          choose → upstream.Pick | rideThrough → takeConnection (Lease) → Allow
//	attempt.go  the attempt, its head   attempt (one try: endpoint, lease, tickets, outcome, verdict, reply);
//	                                    roundTrip → Endpoint.Send → readHead → holdToCommit → holdWindow
//	respond.go  commit, errors          respond(last attempt, obstruction) → commit | obstructed | noReply → fail
//	stream.go   the body after commit   stream (the client's body reader): Read → upstreamEnded → CloseWithError;
//	                                    openStreams, the ones Shutdown interrupts
//	follow.go   a rescuable stream      stream.Read → readEvents → takeEvents → follow: whole events, the text
//	                                    kept; a cut or an in-band error → rescueStream
//	rescue.go   a stream cut mid-answer rescueStream → nextRescue → continueOn → attemptOn (the loop's step),
//	                                    with the continuation's body (continuation)
//	continuation.go  the bodies         chatContinuation (a trailing assistant message, vLLM's flags),
//	                                    prefillMessages (the Messages API's prefill)
//	seam.go     the Messages API's seam messageSeam joins a continuation's events to the cut stream's
//
// Who decides what:
//   - classify an attempt: policy.Classify, on the Outcome roundTrip
//     reports (send keeps it and the verdict on the attempt);
//   - after an attempt, retry in place / fail over / stop, the wait and
//     who set it, the stop reason: policy.Retry.Decide, called once in decide;
//   - before an attempt, wait / fail over / refuse for a cooldown, pacing,
//     an open breaker or a busy upstream: policy.Clear, called in
//     visit.clearWith (gates.go);
//   - retry budget: reserved in decide before Decide (policy.Budget.Reserve),
//     given back when the retry is not sent; a rescue's continuation is
//     paid for the same way (rescueStream);
//   - whether a stream cut mid-answer is continued now: policy.Rescue's
//     Refusal, in rescueStream; the continuation is sent through the
//     loop's own step (attemptOn: gate, choose, send);
//   - breaker outcome: policy.Classify's Health, reported by send
//     (upstream.Tickets.Report); the attempt's time to first token, and
//     whether it counts, by reply.close as it gives the lease back
//     (upstream.Lease.Release), a stream's first content to an adaptive
//     limit as it comes (upstream.Lease.Observe, in firstOutput); sampled decides;
//   - waits end early on shutdown or when the client leaves: visit.wait (and
//     the lease queues, through upstream.LeaseRequest); a client's leaving
//     is noticed by package listener's watcher and acted on by
//     presence.Left (gone.go), which also closes the upstream connection an
//     attempt holds (upstream.Hold.Sever);
//   - commit and the answer: respond; every error body: errorTable, in the
//     shape of the request's API (errorShapes), written by apiError.write
//     (errors.go);
//   - which endpoint of a pool: package upstream (Upstream.Pick), asked
//     by choose with what the request knows (ask); a stream's framing: events.KindOf,
//     events.Next; what its events mean: policy.Judge, policy.FollowChunk,
//     policy.Continuable;
//   - what a request reserves of a token budget, and is charged:
//     policy.EstimateTokens, then its reply's usage (meter.go, settledUsage);
//     the window's arithmetic is policy.TokenWindow's;
//   - what is shared with a fleet: shared.go (package fleet does the
//     Redis side).
//
// The exchange's state is what outlives an attempt, split into named parts
// (exchange.go): the client's presence (gone.go), the outbound request,
// the loop's counts and where it stands, the client's response, the
// access log's notes, the trace's part (a pooled traceState only when the
// request is traced; nil, and every step of it a no-op, when not) and,
// once committed to go as it comes, the client's body (stream, stream.go;
// pooled with the exchange). What the loop learns on one target (a visit:
// the model as sent, its cooldown keys, the endpoints that failed) and of
// one try (an attempt: its endpoint, lease, tickets, outcome, verdict and
// its reply, pooled and taken over by the next try; the reply's head, the
// body bytes held before commit, kept with it but given to a pool of
// heads by a stream once its client has them) is held with the
// exchange (its visit, last and in fields; a continuation's try in its
// stream's rescue) — not on the request's stack, which a stream's judged
// first event would take past 8 KiB — and run by the loop's steps, the
// target's steps being the visit's methods; what
// stood in the way of the targets (an obstruction) goes from run to
// respond, and the answering attempt's reply to the stream at commit
// (respond gives back one not committed). The other files:
//
//	proxy.go       Proxy: New, Reload, Shutdown, the fasthttp server and its lean twin, parse errors, request
//	               ids, and what the admin side reads (Upstreams, Clients, Ready, RefreshBreakerGauges, Failures)
//	options.go     Options and their defaults (an upstream's are upstream.Options); Route, the config
//	               file's shape of a route (its yaml keys), compiled by buildRoute (table.go)
//	table.go       one configuration's routes, upstreams, client limits (match, authorized), prices
//	limits.go      per-client buckets (clients:), bounded (upstream.MaxTrackedKeys); the limits a request
//	               is under (clientLimits.each)
//	tokens.go      token budgets (clients: tokens_per_minute): reserved at admission (clientTokens, a
//	               hook), settled to the reply's usage, a keyBudget per client never dropped in debt
//	spend.go       spend budgets (clients: spend, at prices:): a client's spend a period, refused past it
//	meter.go       the usage a reply tells as it is relayed (meter), for a budget or a trace
//	source.go      who a request is when its credential costs nothing to invent: its source address
//	               (sourceOf), its queue tenant (tenantOf); whether it is authenticated
//	clientkeys.go  single keys' settings (client_keys_file): by SHA-256, a key's own limit and class (classOf)
//	buffers.go     the budget of bytes held for clients (server.max_buffered_bytes) and a request's share of it;
//	               the request bodies' budget (server.max_request_bytes: bodyRoom, holdBody)
//	shared.go      the fleet (package fleet) as the proxy uses it: the running link (shared; nil: no fleet),
//	               its limits and token budgets (reserve, reserveTokens, their names), and what a table does
//	               with its news (adoptCooldown, hint)
//	status.go      a table's status: /debug/upstreams (upstream.Status of each), /debug/clients (the token
//	               budgets, most used first), readiness, gauges refreshed on scrape
//	errors.go      the error vocabulary (errorTable) and its shape per API (errorShapes), written by apiError.write
//	hooks.go       request-level hooks before the loop: reserve at admission (table.hooks; the clients:
//	               limits are the first, the token budgets the second); what they hold is settled in tokens.go
//	summary.go     what a finished request was (summary, read once in finish: the access line
//	               (accesslog.go), the spans' ends (trace.go) and the metrics (measure) are formatters of
//	               it), and report: where the steps say what happened as it happens, each event once (an
//	               attempt started, ended, decided; a retry, a skip, a wait, a failover, a rescue), to the
//	               notes the summary lists, the metrics and the trace — no step of the loop, the response
//	               or a rescue calls those itself
//	accesslog.go   the access line; trace.go the spans (traceState, the request's part in a trace,
//	               told by the loop of each attempt, wait, commit and rescue) and the proxy's tracers
//	               (the current one, those a reload retired)
//	failures.go    the last failed requests (a fixed ring, from the summary) for the status page
//	headers.go     hop-by-hop headers and the names Sturdy reads or writes
//	paths.go       path_prefix confinement (dot-segments)
//	origin.go      web pages: a loopback address's Host and Origin checks, CORS preflights answered here
//	               (crossOrigin), upstreams' CORS headers replaced by Sturdy's (markCORS)
//	listener.go    Serve and ServeTLS: the client listener (package listener: accept errors,
//	               max_connections, write deadlines, the lean server's handoff, the watcher that sees
//	               clients leave) told the server's bounds, its metrics and the refusal's 503
//	recover.go     a panic while serving one request or stream: recovered, logged, counted (survive)
//	gone.go        phases, and the client's presence: a client's leaving acted on (presence.Left, the
//	               listener.Leaver a request's connection tells)
package proxy
