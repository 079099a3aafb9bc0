package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestTheImageAndTheManifestAgreeOnTheUser: the kubelet verifies
// runAsNonRoot only against a numeric user, so the image's USER is a
// number and the Kubernetes example runs as that same user and group.
func TestTheImageAndTheManifestAgreeOnTheUser(t *testing.T) {
	t.Parallel()
	user, group := imageUser(t)
	k8s, err := os.ReadFile("deploy/kubernetes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(k8s)))
	checked := 0
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name            string `yaml:"name"`
							SecurityContext struct {
								RunAsNonRoot bool   `yaml:"runAsNonRoot"`
								RunAsUser    string `yaml:"runAsUser"`
								RunAsGroup   string `yaml:"runAsGroup"`
							} `yaml:"securityContext"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		for _, c := range doc.Spec.Template.Spec.Containers {
			if c.Name != "sturdy" {
				continue
			}
			checked++
			sc := c.SecurityContext
			if !sc.RunAsNonRoot || sc.RunAsUser != user || sc.RunAsGroup != group {
				t.Errorf("%s: securityContext runAsNonRoot %v, runAsUser %q, runAsGroup %q; the image runs as %s:%s", doc.Kind, sc.RunAsNonRoot, sc.RunAsUser, sc.RunAsGroup, user, group)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no sturdy container in deploy/kubernetes.yaml")
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
	b, err := os.ReadFile("deploy/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Build      any    `yaml:"build"`
			Image      string `yaml:"image"`
			PullPolicy string `yaml:"pull_policy"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatal(err)
	}
	built := compose.Services["sturdy"]
	if built.Build == nil || built.Image == "" {
		t.Fatal("service sturdy does not build a named image")
	}
	replica := compose.Services["sturdy-2"]
	if replica.Build != nil || replica.Image != built.Image || replica.PullPolicy != "never" {
		t.Errorf("sturdy-2: build %v, image %q, pull_policy %q; want no build, image %q, pull_policy never", replica.Build, replica.Image, replica.PullPolicy, built.Image)
	}
}
