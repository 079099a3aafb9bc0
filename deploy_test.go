package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sturdy/config"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// k8sPod is what the deploy and chart tests read of a Deployment's pod:
// deploy/kubernetes.yaml's, and the chart's as rendered.
type k8sPod struct {
	TerminationGracePeriodSeconds int            `yaml:"terminationGracePeriodSeconds"`
	InitContainers                []k8sContainer `yaml:"initContainers"`
	Containers                    []k8sContainer `yaml:"containers"`
	Volumes                       []struct {
		Name      string `yaml:"name"`
		ConfigMap struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

type k8sContainer struct {
	Name string   `yaml:"name"`
	Args []string `yaml:"args"`
	Env  []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	RestartPolicy   string    `yaml:"restartPolicy"`
	Startup         *k8sProbe `yaml:"startupProbe"`
	Liveness        *k8sProbe `yaml:"livenessProbe"`
	Readiness       *k8sProbe `yaml:"readinessProbe"`
	SecurityContext struct {
		RunAsNonRoot bool   `yaml:"runAsNonRoot"`
		RunAsUser    string `yaml:"runAsUser"`
		RunAsGroup   string `yaml:"runAsGroup"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

func (c k8sContainer) env(name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// kubernetesExample is deploy/kubernetes.yaml's Deployment pod and its ConfigMap's config.
func kubernetesExample(t *testing.T) (k8sPod, *config.Config) {
	t.Helper()
	b, err := os.ReadFile("deploy/kubernetes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pod *k8sPod
	var cfg *config.Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
			Spec struct {
				Template struct {
					Spec k8sPod `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		switch doc.Kind {
		case "Deployment":
			pod = &doc.Spec.Template.Spec
		case "ConfigMap":
			if cfg, err = config.Parse("kubernetes.yaml ConfigMap", []byte(doc.Data["sturdy.yaml"])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if pod == nil || cfg == nil {
		t.Fatal("deploy/kubernetes.yaml has no Deployment or no ConfigMap")
	}
	return *pod, cfg
}

// TestTheImageAndTheManifestAgreeOnTheUser: the kubelet verifies
// runAsNonRoot only against a numeric user, so the image's USER is a
// number and the Kubernetes example runs as that same user and group.
func TestTheImageAndTheManifestAgreeOnTheUser(t *testing.T) {
	t.Parallel()
	user, group := imageUser(t)
	pod, _ := kubernetesExample(t)
	checked := 0
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		if c.Name != "sturdy" {
			continue
		}
		checked++
		sc := c.SecurityContext
		if !sc.RunAsNonRoot || sc.RunAsUser != user || sc.RunAsGroup != group {
			t.Errorf("securityContext runAsNonRoot %v, runAsUser %q, runAsGroup %q; the image runs as %s:%s", sc.RunAsNonRoot, sc.RunAsUser, sc.RunAsGroup, user, group)
		}
	}
	if checked == 0 {
		t.Fatal("no sturdy container in deploy/kubernetes.yaml")
	}
}

// TestTheKubernetesSidecarStartsFirstAndStopsLast: in the example Sturdy is a
// native sidecar (an init container that keeps running) started once it
// serves, never held back by /readyz; the agent finds it with a placeholder
// key; and the kubelet waits for the agent's drain and Sturdy's grace.
func TestTheKubernetesSidecarStartsFirstAndStopsLast(t *testing.T) {
	t.Parallel()
	pod, cfg := kubernetesExample(t)
	if len(pod.InitContainers) != 1 || pod.InitContainers[0].Name != "sturdy" || pod.InitContainers[0].RestartPolicy != "Always" {
		t.Fatalf("Sturdy is not a native sidecar: init containers %+v", pod.InitContainers)
	}
	if p := pod.InitContainers[0].Startup; p == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port != "admin" {
		t.Errorf("the startup probe is not /healthz on the admin port: %+v", p)
	}
	var agent k8sContainer
	for _, c := range pod.Containers {
		if c.Name == "agent" {
			agent = c
		}
	}
	_, port, _ := strings.Cut(cfg.Listen, ":")
	if agent.env("OPENAI_BASE_URL") != "http://localhost:"+port+"/v1" || agent.env("ANTHROPIC_BASE_URL") != "http://localhost:"+port ||
		agent.env("OPENAI_API_KEY") == "" || agent.env("ANTHROPIC_API_KEY") == "" {
		t.Errorf("the agent does not call Sturdy on localhost with a placeholder key: %+v", agent.Env)
	}
	const agentDrain = 30 * time.Second // the example's comment
	grace := time.Duration(cfg.Server.ShutdownGrace)
	if got := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; got <= agentDrain+grace {
		t.Errorf("terminationGracePeriodSeconds %v is not past the agent's drain %v + shutdown_grace %v", got, agentDrain, grace)
	}
}

// imageUser is the Dockerfile's one USER, which must be numeric (user
// and group).
func imageUser(t *testing.T) (user, group string) {
	t.Helper()
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER\s+(\S+)\s*$`).FindAllStringSubmatch(string(df), -1)
	if len(m) != 1 {
		t.Fatalf("want one USER line in the Dockerfile, found %d", len(m))
	}
	user, group, _ = strings.Cut(m[0][1], ":")
	if !regexp.MustCompile(`^[0-9]+$`).MatchString(user) || !regexp.MustCompile(`^[0-9]+$`).MatchString(group) {
		t.Fatalf("USER %s: not numeric, a kubelet refuses runAsNonRoot with it", m[0][1])
	}
	return user, group
}

// TestTheExampleConfigLeavesTheAddressesToWhereItRuns: a config copied
// from config.example.yaml must not bind the admin listener to a
// container's loopback (probes fail) or pin the proxy's address, so the
// example writes neither; the image's defaults stay in force.
func TestTheExampleConfigLeavesTheAddressesToWhereItRuns(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"listen", "admin_listen"} {
		if _, ok := doc[k]; ok {
			t.Errorf("config.example.yaml sets %s", k)
		}
	}
	if admin, _ := doc["admin"].(map[string]any); admin != nil {
		if _, ok := admin["listen"]; ok {
			t.Error("config.example.yaml sets admin.listen")
		}
	}
}

// TestTheComposeFleetBuildsItsImageOnce: one service builds Sturdy's image;
// the other replica runs it and never looks for it in a registry.
func TestTheComposeFleetBuildsItsImageOnce(t *testing.T) {
	t.Parallel()
	_, compose := composeFile(t)
	built := compose.Services["sturdy"]
	if built.Build == nil || built.Image == "" {
		t.Fatal("service sturdy does not build a named image")
	}
	replica := compose.Services["sturdy-2"]
	if replica.Build != nil || replica.Image != built.Image || replica.PullPolicy != "never" {
		t.Errorf("sturdy-2: build %v, image %q, pull_policy %q; want no build, image %q, pull_policy never", replica.Build, replica.Image, replica.PullPolicy, built.Image)
	}
}

// composeSpec is what the tests read of deploy/docker-compose.yml.
type composeSpec struct {
	Services map[string]struct {
		Build      any            `yaml:"build"`
		Image      string         `yaml:"image"`
		PullPolicy string         `yaml:"pull_policy"`
		Command    any            `yaml:"command"`
		Ports      []string       `yaml:"ports"`
		DependsOn  map[string]any `yaml:"depends_on"`
		Profiles   []string       `yaml:"profiles"`
		Env        map[string]any `yaml:"environment"`
	} `yaml:"services"`
}

// composeFile reads deploy/docker-compose.yml: its text and its services.
func composeFile(t *testing.T) ([]byte, composeSpec) {
	t.Helper()
	b, err := os.ReadFile("deploy/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeSpec
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return b, c
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
	b, compose := composeFile(t)
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
