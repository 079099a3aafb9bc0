package tracing

import (
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
)

func TestResolve(t *testing.T) {
	half := 0.5
	zero := 0.0
	for _, c := range []struct {
		name string
		file File
		env  map[string]string
		want Settings
		on   bool
		err  string
	}{
		{name: "off by default"},
		{name: "file endpoint, /v1/traces appended", file: File{Endpoint: "http://127.0.0.1:4318"}, on: true,
			want: Settings{URL: "http://127.0.0.1:4318/v1/traces", Protocol: ProtocolHTTP, SampleRatio: 1, ServiceName: "sturdy"}},
		{name: "a trailing slash", file: File{Endpoint: "http://c:4318/"}, on: true,
			want: Settings{URL: "http://c:4318/v1/traces", Protocol: ProtocolHTTP, SampleRatio: 1, ServiceName: "sturdy"}},
		{name: "grpc keeps the URL", file: File{Endpoint: "http://c:4317", Protocol: ProtocolGRPC}, on: true,
			want: Settings{URL: "http://c:4317", Protocol: ProtocolGRPC, SampleRatio: 1, ServiceName: "sturdy"}},
		{name: "the env endpoint alone turns tracing on", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel:4318",
			"OTEL_SERVICE_NAME": "gw", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, on: true,
			want: Settings{URL: "https://otel:4318/v1/traces", Protocol: ProtocolHTTP, SampleRatio: 0.25, ServiceName: "gw"}},
		{name: "a signal endpoint is used as written", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://otel:4318/custom",
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318"}, on: true,
			want: Settings{URL: "http://otel:4318/custom", Protocol: ProtocolHTTP, SampleRatio: 1, ServiceName: "sturdy"}},
		{name: "the file wins over the env", file: File{Endpoint: "http://file:4318", SampleRatio: &half, ServiceName: "f",
			Headers: map[string]string{"authorization": "Bearer x"}},
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318", "OTEL_SERVICE_NAME": "e",
				"OTEL_TRACES_SAMPLER": "always_off", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true,
			want: Settings{URL: "http://file:4318", Protocol: ProtocolGRPC, SampleRatio: 0.5, ServiceName: "f",
				Headers: map[string]string{"authorization": "Bearer x"}}},
		{name: "a written 0 ratio", file: File{Endpoint: "http://c:1", SampleRatio: &zero}, on: true,
			want: Settings{URL: "http://c:1/v1/traces", Protocol: ProtocolHTTP, SampleRatio: 0, ServiceName: "sturdy"}},
		{name: "always_off", file: File{Endpoint: "http://c:1"}, env: map[string]string{"OTEL_TRACES_SAMPLER": "always_off"}, on: true,
			want: Settings{URL: "http://c:1/v1/traces", Protocol: ProtocolHTTP, SampleRatio: 0, ServiceName: "sturdy"}},
		{name: "OTEL_SDK_DISABLED wins", file: File{Endpoint: "http://c:1"}, env: map[string]string{"OTEL_SDK_DISABLED": "true"}},
		{name: "OTEL_TRACES_EXPORTER=none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:1"}},
		{name: "a bad env endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "otel:4318"}, err: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{name: "a bad ratio", file: File{Endpoint: "http://c:1"}, env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio",
			"OTEL_TRACES_SAMPLER_ARG": "2"}, err: "OTEL_TRACES_SAMPLER_ARG"},
		{name: "an unknown sampler", file: File{Endpoint: "http://c:1"}, env: map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote"},
			err: "OTEL_TRACES_SAMPLER"},
		{name: "an unknown protocol", file: File{Endpoint: "http://c:1"}, env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			err: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{name: "the signal's protocol is named", file: File{Endpoint: "http://c:1"},
			env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, err: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		{name: "the signal's endpoint is named", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "c:4318"},
			err: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{name: "empty headers set none", file: File{Endpoint: "http://c:1", Headers: map[string]string{}}, on: true,
			want: Settings{URL: "http://c:1/v1/traces", Protocol: ProtocolHTTP, SampleRatio: 1, ServiceName: "sturdy"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, on, err := Resolve(c.file, func(k string) string { return c.env[k] })
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one naming %s", err, c.err)
				}
				return
			}
			if c.on && !Exporters {
				// A build without the exporters (-tags sturdy_notracing)
				// refuses what would turn tracing on, naming it.
				from := "remove tracing.endpoint"
				switch {
				case c.file.Endpoint != "":
				case c.env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] != "":
					from = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "
				default:
					from = "OTEL_EXPORTER_OTLP_ENDPOINT: "
				}
				if !errors.Is(err, ErrNoExporters) || on || !strings.Contains(err.Error(), from) {
					t.Fatalf("on %v err %v, want ErrNoExporters naming %s", on, err, from)
				}
				return
			}
			if err != nil || on != c.on {
				t.Fatalf("on %v err %v", on, err)
			}
			if on && (got.URL != c.want.URL || got.Protocol != c.want.Protocol || got.SampleRatio != c.want.SampleRatio ||
				got.ServiceName != c.want.ServiceName || len(got.Headers) != len(c.want.Headers) || (got.Headers == nil) != (c.want.Headers == nil)) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestCheckEndpoint(t *testing.T) {
	for raw, ok := range map[string]bool{"http://127.0.0.1:4318": true, "https://otel.example:443/otlp": true,
		"127.0.0.1:4318": false, "ftp://x": false, "http://": false, "http://u:SECRET@x:1": false, "http://x:1/?token=SECRET": false,
		"http://x:1/#SECRET": false} {
		err := CheckEndpoint(raw)
		if (err == nil) != ok {
			t.Errorf("%q: %v", raw, err)
		}
		if err != nil && strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%q: the message quotes the URL: %v", raw, err)
		}
	}
}

func TestLogErrorsLogsTheFirstThenAtMostOneAWhile(t *testing.T) {
	var got []int
	LogErrors(func(err error, suppressed int) { got = append(got, suppressed) })
	defer otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {}))
	for range 5 {
		otel.Handle(errors.New("collector down"))
	}
	if len(got) != 1 || got[0] != 0 {
		t.Fatalf("logged %v, want one line", got)
	}
}
