package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencyDirection keeps the layering (README, Layout) one way: policy and
// breaker import nothing of ours, proxy does not know the config schema, the
// upstream side knows neither the request path nor the config, and config —
// which decodes an upstream into the upstream side's own Options (one shape) —
// never knows the request path.
func TestDependencyDirection(t *testing.T) {
	t.Parallel()
	forbidden := map[string][]string{
		"sturdy/policy":   {"sturdy/"},
		"sturdy/breaker":  {"sturdy/"},
		"sturdy/events":   {"sturdy/"},
		"sturdy/fleet":    {"sturdy/"},
		"sturdy/proxy":    {"sturdy/config", "sturdy/internal/"},
		"sturdy/upstream": {"sturdy/proxy", "sturdy/config", "sturdy/internal/"},
		"sturdy/config":   {"sturdy/proxy", "sturdy/fleet"},
		"sturdy/units":    {"sturdy/"},
	}
	for pkg, bad := range forbidden {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == pkg {
				continue
			}
			for _, b := range bad {
				if strings.HasPrefix(dep, b) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
