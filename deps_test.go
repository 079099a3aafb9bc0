package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"sturdy/config"
)

// TestDependencyDirection keeps the layering (README, Layout) one way: policy and
// breaker import nothing of ours, proxy does not know the config schema, the
// upstream side knows neither the request path nor the config.
func TestDependencyDirection(t *testing.T) {
	t.Parallel()
	forbidden := map[string][]string{
		"sturdy/policy":   {"sturdy/"},
		"sturdy/breaker":  {"sturdy/"},
		"sturdy/events":   {"sturdy/"},
		"sturdy/fleet":    {"sturdy/"},
		"sturdy/proxy":    {"sturdy/config", "sturdy/internal/"},
		"sturdy/upstream": {"sturdy/proxy", "sturdy/config", "sturdy/internal/"},
		"sturdy/config":   {"sturdy/proxy", "sturdy/breaker"},
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
	t.Parallel()
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

// TestDeployFilesHoldTogether checks what CI cannot run (no Docker
// engine): in docker-compose.yml the agent's model is the one pulled,
// everything published is on the host's loopback, and services wait for
// what they need to be healthy, Jaeger is optional; the Kubernetes image is loadable without
// a registry.
func TestDeployFilesHoldTogether(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("deploy/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image     string         `yaml:"image"`
			Command   any            `yaml:"command"`
			Ports     []string       `yaml:"ports"`
			DependsOn map[string]any `yaml:"depends_on"`
			Profiles  []string       `yaml:"profiles"`
			Env       map[string]any `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatal(err)
	}
	pull := fmt.Sprint(compose.Services["ollama-pull"].Command)
	agent := fmt.Sprint(compose.Services["agent"].Command)
	if !strings.Contains(pull, "llama3.1") || !strings.Contains(agent, `model=\"llama3.1\"`) && !strings.Contains(agent, `model="llama3.1"`) {
		t.Errorf("the agent asks for a model the pull service does not pull: pull %q, agent %q", pull, agent)
	}
	for name, s := range compose.Services {
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s publishes %s beyond the host's loopback", name, p)
			}
		}
	}
	if _, ok := compose.Services["agent"].DependsOn["sturdy"].(map[string]any); !ok {
		t.Error("the agent does not wait for Sturdy to be healthy")
	}
	// Jaeger is there on demand only, and both replicas can be pointed at it.
	if j := compose.Services["jaeger"]; fmt.Sprint(j.Profiles) != "[tracing]" || !strings.Contains(string(b), "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318") {
		t.Error("no optional Jaeger (profile tracing) with the endpoint to give Sturdy")
	}
	for _, name := range []string{"sturdy", "sturdy-2"} {
		if _, ok := compose.Services[name].Env["OTEL_EXPORTER_OTLP_ENDPOINT"]; !ok {
			t.Errorf("%s cannot be pointed at Jaeger (no OTEL_EXPORTER_OTLP_ENDPOINT)", name)
		}
	}
	k8s, err := os.ReadFile("deploy/kubernetes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s := string(k8s); strings.Contains(s, ":latest") || !strings.Contains(s, "imagePullPolicy: IfNotPresent") {
		t.Error("the Kubernetes example needs a local image: no :latest, imagePullPolicy: IfNotPresent")
	}
}
