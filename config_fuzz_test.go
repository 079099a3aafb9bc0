package main

import (
	"os"
	"testing"

	"github.com/rs/zerolog"

	"sturdy/config"
	"sturdy/metrics"
	"sturdy/proxy"
)

// FuzzConfigBuildsAProxy checks that validation covers everything the
// proxy needs: any document the loader accepts builds a proxy.
func FuzzConfigBuildsAProxy(f *testing.F) {
	if b, err := os.ReadFile("config.example.yaml"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		"upstreams: [{name: a, url: 'http://h'}]\n",
		"upstreams: [{name: a, url: 'http://h:1/p/'}, {name: b, url: 'https://h'}]\nroutes:\n  - {name: r, upstream: a, fallbacks: [{upstream: b, model: m}]}\n",
		"upstreams: [{name: a, url: 'http://h', rate_limit: {requests_per_second: 0.5}, max_in_flight: 2}]\nclients: [{requests_per_second: 1}]\n",
		"upstreams: [{name: a, url: 'http://[::1]:8'}]\nroutes: [{name: r, upstream: a, model: 'gpt-*', retry: {on: [5xx], on_timeout: failover}}]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		cfg, err := config.Parse("fuzz.yaml", doc)
		if err != nil {
			return
		}
		p, err := proxy.New(proxyOptions(cfg, zerolog.Nop(), metrics.New()))
		if err != nil {
			t.Fatalf("accepted a config the proxy refuses: %v\n%s", err, doc)
		}
		p.CloseIdleConnections()
	})
}
