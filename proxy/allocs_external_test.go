//go:build external && !race

package proxy

import (
	"testing"
	"time"

	"sturdy/fleet"
	"sturdy/internal/redistest"
	"sturdy/upstream"
)

// TestAProxiedRequestWithAFleetAllocatesAtMostThrice holds the figure
// with a fleet-wide pace spent from a lease (its name was once
// concatenated per request: 3) and a leased client limit, which adds its
// name, the credential's hash in hex (it was formatted: 8).
func TestAProxiedRequestWithAFleetAllocatesAtMostThrice(t *testing.T) {
	holdAllocs(t, []allocCase{
		{"a leased fleet pace", 2, func(t *testing.T) func(*Options) {
			r := redistest.Start(t)
			return func(o *Options) {
				o.SharedState = &SharedState{Config: fleet.Config{URL: r.URL, Prefix: "t:", Timeout: 500 * time.Millisecond}}
				o.Upstreams[0].RateLimit = upstream.RateLimit{RequestsPerSecond: 1e6, Burst: 1e5, MaxWait: time.Second}
			}
		}, false},
		{"a leased client limit", 3, func(t *testing.T) func(*Options) {
			r := redistest.Start(t)
			return func(o *Options) {
				o.SharedState = &SharedState{Config: fleet.Config{URL: r.URL, Prefix: "t:", Timeout: 500 * time.Millisecond}}
				o.Clients = []ClientLimit{{KeyHeader: "Authorization", RequestsPerSecond: 1e6, Burst: 1e5}}
			}
		}, false},
	})
}
