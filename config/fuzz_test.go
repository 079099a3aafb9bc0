package config

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// FuzzParse feeds arbitrary documents to the loader: it must never panic,
// and a rejection must say, for each problem, what is wrong and on which
// line of the document (never a line past its end). That whatever it
// accepts really runs is checked in package main (FuzzConfigBuildsAProxy).
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile("../config.example.yaml"); err == nil {
		f.Add(b)
	}
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		_, err := Parse("fuzz.yaml", doc)
		if err == nil {
			return
		}
		var ce *Error
		if !errors.As(err, &ce) || len(ce.Problems) == 0 {
			t.Fatalf("rejection without problems: %v", err)
		}
		// Lines as YAML counts them: a lone \r breaks one too.
		lines := bytes.Count(doc, []byte("\n")) + bytes.Count(doc, []byte("\r")) - bytes.Count(doc, []byte("\r\n")) + 1
		for _, p := range ce.Problems {
			if p.Msg == "" || p.Line < 0 || p.Line > lines {
				t.Fatalf("problem %+v in a %d-line document", p, lines)
			}
		}
	})
}

// fuzzSeeds are documents for FuzzParse, valid and not.
var fuzzSeeds = []string{
	"upstreams: [{name: a, url: 'http://h'}]\n",
	"listen: :1\nupstreams:\n  - name: a\n    url: http://h\n    timeouts: {connect: 1s}\nroutes:\n  - {name: r, upstream: a, fallbacks: [{upstream: a}]}\n",
	"upstreams: [{name: a, url: 'http://h', breaker: {failure_ratio: 2}}]\n",
	"upstreams: [{name: a, url: 'http://h', retry_budget: {ratio: 0}}]\n",
	"routes: [{name: r, upstream: nope}]\n",
	"{", "- - -", "upstreams: !!binary AAAA", "a: &x [*x]", "",
}
