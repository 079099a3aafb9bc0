package main

import (
	"time"

	"sturdy/config"
	"sturdy/internal/fakellm"
)

// demoProfile is the fake model server of `sturdy -demo`: mostly healthy,
// with enough passing faults that the log shows retries, and a 15 s
// outage a minute in that shows the breaker opening and recovering.
var demoProfile = fakellm.Profile{
	Seed:         1,
	Status:       map[int]float64{503: 0.08, 429: 0.04, 500: 0.03},
	RetryAfter:   300 * time.Millisecond,
	RetryAfterMS: true,
	Reset:        0.03,
	TTFT:         fakellm.Latency{Base: 150 * time.Millisecond, Jitter: 100 * time.Millisecond},
	InterToken:   fakellm.Latency{Base: 30 * time.Millisecond, Jitter: 20 * time.Millisecond},
	Tokens:       24,
	Outage:       fakellm.Outage{From: 60 * time.Second, To: 75 * time.Second},
}

func startDemoUpstream() (*fakellm.Server, error) {
	return fakellm.Start("127.0.0.1:0", demoProfile)
}

// demoFaults says, in the startup log, what the demo's fake server does.
var demoFaults = "8% 503, 4% 429 (retry-after-ms 300), 3% 500, 3% resets; down from 60s to 75s after start (the breaker opens, then recovers)"

// demoListen is the demo's address unless -listen, STURDY_LISTEN or an
// image's STURDY_DEFAULT_LISTEN says otherwise: loopback, as a toy's should be.
const demoListen = "127.0.0.1:8080"

// demoConfig makes the breaker quick to show: it opens after 5 failures
// in a row and probes again after 5 s.
func demoConfig(cfg *config.Config) {
	u := &cfg.Upstreams[0]
	u.Name = "demo-llm"
	u.Breaker.ConsecutiveFailures = 5
	u.Breaker.OpenFor = 5 * time.Second
	cfg.Routes[0].Upstream = u.Name
	cfg.Log.Format = "console"
}
