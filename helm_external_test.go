//go:build external

package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"sturdy/config"
	"sturdy/internal/testdeps"
)

// helmVersion is the helm .ci/run installs from its Go module (Debian has
// no helm package).
const helmVersion = "v4.3.2"

const chart = "deploy/helm/sturdy"

// helm runs the helm binary with args and returns its output.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := testdeps.Binary(t, "helm", "go install helm.sh/helm/v4/cmd/helm@"+helmVersion+` && export PATH="$(go env GOPATH)/bin:$PATH"`)
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// k8sObject is what the checks read of a rendered manifest.
type k8sObject struct {
	Kind     string            `yaml:"kind"`
	Data     map[string]string `yaml:"data"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Ports []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
		Endpoints []struct {
			Port string `yaml:"port"`
			Path string `yaml:"path"`
		} `yaml:"endpoints"`
		Template struct {
			Spec k8sPod `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// port is the container port named name (0: none).
func (c k8sContainer) port(name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// TestTheHelmChartRendersWhatSturdyRuns lints the chart and renders it in
// both modes, with other ports and with the ServiceMonitor, and checks the
// manifests as a cluster would meet them: the ConfigMap's config passes
// -check, the probes and the Service reach the ports the config binds, the
// config is mounted as a directory (so a changed ConfigMap reaches the
// file and Sturdy reloads it), the container runs as the image's user, and
// Sturdy starts before and stops after an agent beside it: a native sidecar
// from Kubernetes 1.29 on, an ordinary container that keeps serving through
// the agent's drain below.
func TestTheHelmChartRendersWhatSturdyRuns(t *testing.T) {
	t.Parallel()
	if out, err := helm(t, "lint", "--strict", chart); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	if out, err := helm(t, "lint", "--strict", chart, "--set", "mode=sidecar,agent.image=agent:1"); err != nil {
		t.Fatalf("helm lint (sidecar): %v\n%s", err, out)
	}
	user, group := imageUser(t)
	ownUpstream := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(ownUpstream, []byte("config:\n  upstreams:\n    - {name: vllm, url: \"http://vllm:8000\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		kube    string
		set     string
		sidecar bool
		monitor bool
	}{
		{"standalone", "1.30.0", "", false, false},
		{"standalone, Kubernetes 1.28", "1.28.0", "", false, false},
		{"sidecar", "1.30.0", "mode=sidecar,agent.image=agent:1", true, false},
		{"sidecar, Kubernetes 1.29", "1.29.0", "mode=sidecar,agent.image=agent:1", true, false},
		{"sidecar, Kubernetes 1.28", "1.28.0", "mode=sidecar,agent.image=agent:1", true, false},
		{"sidecar, a longer drain", "1.28.0", "mode=sidecar,agent.image=agent:1,agent.drainSeconds=90,shutdown.graceSeconds=20", true, false},
		{"other ports, a ServiceMonitor", "1.30.0", "ports.proxy=8181,ports.admin=9191,serviceMonitor.enabled=true", false, true},
		// Helm replaces a list a values file sets: upstreams alone must
		// still make a config that runs.
		{"a values file's own upstream", "1.30.0", "values:" + ownUpstream, false, false},
	} {
		native := tc.sidecar && tc.kube >= "1.29"
		args := []string{"template", "r", chart, "--kube-version", tc.kube}
		if file, ok := strings.CutPrefix(tc.set, "values:"); ok {
			args = append(args, "-f", file)
		} else if tc.set != "" {
			args = append(args, "--set", tc.set)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("%s: helm template: %v\n%s", tc.name, err, out)
		}
		objs := map[string]k8sObject{}
		dec := yaml.NewDecoder(strings.NewReader(out))
		for {
			var o k8sObject
			if err := dec.Decode(&o); err != nil {
				break
			}
			if o.Kind != "" {
				objs[o.Kind] = o
			}
		}
		cfg, err := config.Parse(tc.name+" ConfigMap", []byte(objs["ConfigMap"].Data["sturdy.yaml"]))
		if err != nil {
			t.Fatalf("%s: the rendered config fails -check: %v", tc.name, err)
		}
		dep := objs["Deployment"].Spec.Template.Spec
		var sturdy, agent *k8sContainer
		for i, c := range dep.Containers {
			switch c.Name {
			case "sturdy":
				sturdy = &dep.Containers[i]
			case "agent":
				agent = &dep.Containers[i]
			}
		}
		if native {
			// A native sidecar: an init container that keeps running.
			if sturdy != nil || len(dep.InitContainers) != 1 || dep.InitContainers[0].Name != "sturdy" || dep.InitContainers[0].RestartPolicy != "Always" {
				t.Fatalf("%s: Sturdy is not a native sidecar: init containers %+v", tc.name, dep.InitContainers)
			}
			sturdy = &dep.InitContainers[0]
		} else if len(dep.InitContainers) != 0 || sturdy == nil || sturdy.RestartPolicy != "" {
			// An API server before 1.29 drops restartPolicy, and the pod never starts.
			t.Fatalf("%s: Sturdy is not an ordinary container: init containers %+v, sturdy %+v", tc.name, dep.InitContainers, sturdy)
		}
		// Started (what a native sidecar's agent waits for) once it serves, whether
		// or not its upstreams are up.
		if p := sturdy.Startup; p == nil || p.HTTPGet.Port != "admin" || p.HTTPGet.Path != "/healthz" {
			t.Errorf("%s: the startup probe is not /healthz on the admin port: %+v", tc.name, p)
		}
		// Sturdy serves until the agent is done, and the kubelet waits for its grace.
		drain := 30 * time.Second
		if tc.name == "sidecar, a longer drain" {
			drain = 90 * time.Second
		}
		delay, grace := time.Duration(cfg.Server.ShutdownDelay), time.Duration(cfg.Server.ShutdownGrace)
		switch {
		case native && delay != 0:
			t.Errorf("%s: a native sidecar is signalled after the agent exits; shutdown_delay %v", tc.name, delay)
		case tc.sidecar && !native && delay < drain:
			t.Errorf("%s: shutdown_delay %v is shorter than the agent's drain %v", tc.name, delay, drain)
		case !tc.sidecar && delay == 0:
			t.Errorf("%s: no shutdown_delay while the Service drops the pod", tc.name)
		}
		before := delay
		if tc.sidecar {
			before = drain
		}
		if got := time.Duration(dep.TerminationGracePeriodSeconds) * time.Second; got <= before+grace {
			t.Errorf("%s: terminationGracePeriodSeconds %v is not past %v (drain or delay) + %v (grace)", tc.name, got, before, grace)
		}
		_, adminPort, _ := net.SplitHostPort(cfg.AdminListen)
		_, proxyPort, _ := net.SplitHostPort(cfg.Listen)
		if strconv.Itoa(sturdy.port("admin")) != adminPort || strconv.Itoa(sturdy.port("proxy")) != proxyPort {
			t.Errorf("%s: container ports admin %d, proxy %d; the config binds %s and %s", tc.name, sturdy.port("admin"), sturdy.port("proxy"), cfg.AdminListen, cfg.Listen)
		}
		for what, p := range map[string]*k8sProbe{"liveness": sturdy.Liveness, "readiness": sturdy.Readiness} {
			if p == nil || p.HTTPGet.Port != "admin" {
				t.Errorf("%s: the %s probe is not on the admin port: %+v", tc.name, what, p)
			}
		}
		if sc := sturdy.SecurityContext; !sc.RunAsNonRoot || sc.RunAsUser != user || sc.RunAsGroup != group {
			t.Errorf("%s: securityContext %+v; the image runs as %s:%s", tc.name, sc, user, group)
		}
		if len(sturdy.VolumeMounts) != 1 || sturdy.VolumeMounts[0].SubPath != "" || len(sturdy.Args) != 2 ||
			!strings.HasPrefix(sturdy.Args[1], sturdy.VolumeMounts[0].MountPath+"/") || dep.Volumes[0].ConfigMap.Name != objs["ConfigMap"].Metadata.Name {
			t.Errorf("%s: the config is not read from the ConfigMap mounted as a directory: args %v, mounts %+v", tc.name, sturdy.Args, sturdy.VolumeMounts)
		}
		if tc.sidecar {
			// The SDKs find Sturdy, and start: they refuse to without a key.
			if agent == nil || agent.env("OPENAI_BASE_URL") != "http://localhost:"+proxyPort+"/v1" ||
				agent.env("ANTHROPIC_BASE_URL") != "http://localhost:"+proxyPort ||
				agent.env("OPENAI_API_KEY") == "" || agent.env("ANTHROPIC_API_KEY") == "" {
				t.Errorf("%s: the agent does not call Sturdy on localhost with a placeholder key: %+v", tc.name, agent)
			}
		} else if agent != nil {
			t.Errorf("%s: an agent container in standalone mode", tc.name)
		}
		svc := map[string]int{}
		for _, p := range objs["Service"].Spec.Ports {
			svc[p.TargetPort] = p.Port
		}
		if strconv.Itoa(svc["admin"]) != adminPort || (!tc.sidecar && strconv.Itoa(svc["proxy"]) != proxyPort) {
			t.Errorf("%s: Service ports %v", tc.name, svc)
		}
		if sm, ok := objs["ServiceMonitor"]; ok != tc.monitor || (ok && (len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics")) {
			t.Errorf("%s: ServiceMonitor present %v (want %v): %+v", tc.name, ok, tc.monitor, sm)
		}
	}
	// What would not run is refused at render time, with the reason.
	for set, want := range map[string]string{
		"mode=sidecar":                    "needs agent.image",
		"mode=both":                       "neither standalone nor sidecar",
		"config.listen=:1":                "leave listen and admin_listen out",
		"config.admin.listen=:1":          "leave it out",
		"config.server.shutdown_delay=1s": "the chart sets them",
		"shutdown.graceSeconds=0":         "at least 1",
		"agent.drainSeconds=-1":           "0 or more",
	} {
		if out, err := helm(t, "template", "r", chart, "--set", set); err == nil || !strings.Contains(out, want) {
			t.Errorf("--set %s: err %v, output %q; want a failure saying %q", set, err, out, want)
		}
	}
}

// TestTheREADMEsHelmCommandsRender renders the chart with the arguments of
// each helm install in the README (the local chart for the released one).
func TestTheREADMEsHelmCommandsRender(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, cmd := range shellCommands(string(b)) {
		w := words(cmd)
		if len(w) < 4 || w[0] != "helm" || w[1] != "install" {
			continue
		}
		n++
		args := append([]string{"template", w[2], chart}, w[4:]...)
		if out, err := helm(t, args...); err != nil {
			t.Errorf("%s: helm %v: %v\n%s", cmd, args, err, out)
		}
	}
	if n == 0 {
		t.Fatal("the README has no helm install")
	}
}
