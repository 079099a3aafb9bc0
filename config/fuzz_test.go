package config

import (
	"os"
	"testing"
)

// FuzzParse feeds arbitrary documents to the loader: it must never panic,
// and whatever it accepts must be valid.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile("../config.example.yaml"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		"upstreams: [{name: a, url: 'http://h'}]\n",
		"listen: :1\nupstreams:\n  - name: a\n    url: http://h\n    timeouts: {connect: 1s}\nroutes:\n  - {name: r, upstream: a, fallbacks: [{upstream: a}]}\n",
		"upstreams: [{name: a, url: 'http://h', breaker: {failure_ratio: 2}}]\n",
		"routes: [{name: r, upstream: nope}]\n",
		"{", "- - -", "upstreams: !!binary AAAA", "a: &x [*x]", "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		c, err := Parse("fuzz.yaml", doc)
		if err != nil {
			return
		}
		if ps := c.Validate(); len(ps) > 0 {
			t.Fatalf("accepted an invalid config: %+v", ps)
		}
	})
}
