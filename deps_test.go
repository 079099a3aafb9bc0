package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"sturdy/config"
)

// TestDependencyDirection keeps the layering of STYLE.md true: policy and
// breaker import nothing of ours, proxy does not know the config schema.
func TestDependencyDirection(t *testing.T) {
	forbidden := map[string][]string{
		"sturdy/policy":  {"sturdy/"},
		"sturdy/breaker": {"sturdy/"},
		"sturdy/events":  {"sturdy/"},
		"sturdy/fleet":   {"sturdy/"},
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

// TestDeployConfigsAreValid: the configs of deploy/ — the compose fleet's
// and the Kubernetes ConfigMap's — pass -check.
func TestDeployConfigsAreValid(t *testing.T) {
	if _, err := config.Load("deploy/sturdy-fleet.yaml"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("deploy/kubernetes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	found := false
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		if doc.Kind == "ConfigMap" {
			found = true
			if _, err := config.Parse("kubernetes.yaml ConfigMap", []byte(doc.Data["sturdy.yaml"])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !found {
		t.Fatal("no ConfigMap in deploy/kubernetes.yaml")
	}
}
