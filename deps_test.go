package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDependencyDirection keeps the layering (docs/design.md, Layout) one
// way: policy, breaker and listener import nothing of ours, nothing but
// commands (main, tools/configref) imports config, and the upstream side
// does not know the request path. Config decodes an upstream and a route
// straight into the types that compile them (upstream.Options,
// proxy.Route: one shape each), so it imports those packages, never the
// other way round.
func TestDependencyDirection(t *testing.T) {
	t.Parallel()
	forbidden := map[string][]string{
		"sturdy/policy":   {"sturdy/"},
		"sturdy/breaker":  {"sturdy/"},
		"sturdy/events":   {"sturdy/"},
		"sturdy/fleet":    {"sturdy/"},
		"sturdy/proxy":    {"sturdy/config", "sturdy/internal/"},
		"sturdy/upstream": {"sturdy/proxy", "sturdy/config", "sturdy/internal/"},
		"sturdy/admin":    {"sturdy/config"},
		"sturdy/units":    {"sturdy/"},
		"sturdy/listener": {"sturdy/"},
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

// TestTheBuildWithoutTracingLinksNoExporter keeps what -tags
// sturdy_notracing is for (docs/observability.md, Traces): the OTLP exporters, and the
// gRPC stack only they link, stay out of that build — an import of either
// from anywhere else would put a quarter of the process's memory back.
func TestTheBuildWithoutTracingLinksNoExporter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tags string
		want bool
	}{{"", true}, {"sturdy_notracing", false}} {
		out, err := exec.Command("go", "list", "-tags", c.tags, "-deps", ".").Output()
		if err != nil {
			t.Fatalf("go list -tags %q: %v", c.tags, err)
		}
		for _, pkg := range []string{"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp",
			"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc", "google.golang.org/grpc"} {
			if got := slices.Contains(strings.Fields(string(out)), pkg); got != c.want {
				t.Errorf("-tags %q: %s linked %v, want %v", c.tags, pkg, got, c.want)
			}
		}
	}
}
