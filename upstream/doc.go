// Package upstream is Sturdy's upstream side: the model servers a
// request may be sent to, each a pool of endpoints (replicas) with its
// traffic policy. The request path (package proxy) uses it in three
// steps:
//
//	pick + lease  Upstream.Pick(Ask) → Endpoint.Lease(LeaseRequest) → Endpoint.Allow (breaker Tickets)
//	send          Endpoint.Send(Hold, request, response, timeout) → upstreamTransport.RoundTrip
//	report        Tickets.Report, Endpoint.Outcome, Endpoint.CountAttempt; Lease.Observe(Sample), Lease.Release(Sample)
//
// and, of a response sent, asks whether its connection was stale (Stale)
// and sets how its body is read (MarkStreaming, CapReads); an upstream's
// max_in_flight slots (TakeSlot) take the same LeaseRequest.
//
// A LeaseRequest may wait in a queue (Wait) that shutdown (Cancel) or the
// client leaving (Gone) ends; it names a Priority and a Tenant, which an
// endpoint's concurrency queue orders by (interactive before batch,
// tenants in turn; max_in_flight's and max_connections' waits are first
// come, first served). A lease is told a stream's first content as it
// comes (Observe), and given back with the attempt's Sample (Release):
// its time to first token, whether it Counts (not for a stale
// connection's replay, an attempt whose client left, or one that failed
// before it was sent), whether it was a stream's first content, the
// prompt's size and whether the attempt met an overload — which an
// adaptive concurrency limit follows (concurrency.go); a refused lease
// says which limit refused it and how soon a place is likely free
// (Lease.Refusal). A Hold is what a request holds of the connection its
// attempt was given, so the request path can close it when the client
// leaves (Hold.Sever) without the upstream side knowing the request.
//
// Who decides what:
//   - which endpoint: policy.PickLeastRequests / PickRoundRobin /
//     PickAffinity, in Pick, over the candidates' load, slow start
//     weight and recent failures (Endpoint.weight, soundness), and with
//     concurrency on their headroom, one that would shed left out while
//     another can take the request (weighRoom);
//   - whether an endpoint may take an attempt: its connection breaker
//     and its reply breaker of the model (Allow), its health checks and
//     DNS (Out, Usable), max_ejected (mayEject);
//   - what an attempt's result means, whether to retry, wait or fail
//     over: not here — the request path asks policy, and reports the
//     result back (Tickets.Report);
//   - how many requests an endpoint takes at once, and who waits first:
//     its concurrency (fixed, or gradient: Gradient2 on streamed replies'
//     time to first content; an overload backs it off once per round
//     trip — what is an overload is policy.Overloaded), under its own lock;
//   - why no endpoint can take a request, and until when: AllOut,
//     NextChange (the request path asks policy.Clear what it means and
//     does the waiting).
//
// The files:
//
//	options.go    Options of an upstream (the config file's shape of one: its yaml keys) and their
//	              defaults; Env, what one proxy's upstreams share
//	upstream.go   Upstream: New (a reload keeps unchanged endpoints), Own, Start, Close; breaker events logged and exported
//	endpoint.go   Endpoint: its client, breakers and Tickets, load and failing share, its leases and their samples, Send and the claim of its connection
//	pick.go       Pick and the questions around it: Usable, Elsewhere, AnyUsable, AllOut, NextChange, AffinityKey
//	health.go     health checks and DNS discovery (the background loop), draining
//	transport.go  the dial and the upstream connection (idle deadlines, stale connections, Hold), DialError, IsTimeout
//	roundtrip.go  the round trip: head, small bodies read whole, streamed bodies, trailers
//	limits.go     cooldowns learned from 429s (bounded: MaxTrackedKeys), Slots, LeaseRequest, Lease, Sample;
//	              tokens_per_minute windows per model glob (ModelTokens; Upstream.Tokens picks one)
//	concurrency.go  a limit per endpoint (concurrency:): its options, the adaptive control law (gradient),
//	              the queue in front of it (classes, tenants in turn, bounded, its drain for Retry-After)
//	status.go     what /debug/upstreams shows (Status, no secret in it) and the gauges refreshed on scrape
package upstream
