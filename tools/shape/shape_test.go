package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestTheRequestPathKeepsItsShape holds the redesign's shape: in the
// request path (proxy) files call each other one way, and in the
// packages around it no type's methods spread over more than
// maxMethodFiles files and no function passes maxFuncLines (shape:long
// excepted).
func TestTheRequestPathKeepsItsShape(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(&out, []string{"sturdy/proxy", "sturdy/policy", "sturdy/events"}, "proxy.exchange", 10); err != nil {
		t.Fatal(err)
	}
	report := out.String()
	for _, want := range []string{
		"## Types whose methods span more than 4 files\n\nNone.\n",
		"\n0 over 60 lines, not marked long by design.\n",
		"## File-level call cycles per package\n\nNone.\n",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
}
