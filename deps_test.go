package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencyDirection keeps the layering of STYLE.md true: policy and
// breaker import nothing of ours, proxy does not know the config schema.
func TestDependencyDirection(t *testing.T) {
	forbidden := map[string][]string{
		"sturdy/policy":  {"sturdy/"},
		"sturdy/breaker": {"sturdy/"},
		"sturdy/events":  {"sturdy/"},
		"sturdy/proxy":   {"sturdy/config", "sturdy/internal/"},
		"sturdy/config":  {"sturdy/proxy", "sturdy/breaker"},
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
