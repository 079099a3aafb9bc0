package main

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"sturdy/internal/otlptest"
	"sturdy/internal/upstreamtest"
)

// TestTracingFromTheEnvironment: OTEL_EXPORTER_OTLP_ENDPOINT alone turns
// tracing on for the binary with its embedded config, and the other
// OTEL_* variables fill in what no file sets.
func TestTracingFromTheEnvironment(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	env := append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.URL, "OTEL_SERVICE_NAME=gateway-from-env",
		"OTEL_RESOURCE_ATTRIBUTES=deployment.environment.name=test", "OTEL_BSP_SCHEDULE_DELAY=50")
	p := runBinaryCmd(t, func(bin string, args ...string) *exec.Cmd {
		c := exec.Command(bin, args...)
		c.Env = env
		return c
	}, func(listen, admin string) []string {
		return []string{"-upstream", up.URL, "-listen", listen, "-admin-listen", admin}
	})
	resp, err := http.Post("http://"+p.addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	spans := rcv.Await(t, 5*time.Second, func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.Kind == tracepb.Span_SPAN_KIND_SERVER {
				return true
			}
		}
		return false
	})
	res := spans[0].Resource
	if res["service.name"] != "gateway-from-env" || res["deployment.environment.name"] != "test" || res["service.version"] != version {
		t.Fatalf("resource %v", res)
	}
	if !strings.Contains(p.logs.String(), "tracing on") {
		t.Fatalf("startup does not say tracing is on:\n%s", p.logs.String())
	}
}

// TestCheckReportsTracing: -check says where spans go, and names a wrong
// OTEL_* variable instead of starting without traces.
func TestCheckReportsTracing(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	var out, errb bytes.Buffer
	if code := run([]string{"-check"}, &out, &errb); code != 0 || !strings.Contains(out.String(),
		"tracing on: http/protobuf to http://127.0.0.1:4318/v1/traces, sample ratio 1, service sturdy") {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
	t.Setenv("OTEL_TRACES_SAMPLER", "traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "1.5")
	out.Reset()
	errb.Reset()
	if code := run([]string{"-check"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "OTEL_TRACES_SAMPLER_ARG") {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
	t.Setenv("OTEL_SDK_DISABLED", "true")
	out.Reset()
	if code := run([]string{"-check"}, &out, &errb); code != 0 || strings.Contains(out.String(), "tracing on") {
		t.Fatalf("OTEL_SDK_DISABLED: exit %d\n%s", code, out.String())
	}
}
