// Package tracing is Sturdy's OpenTelemetry side: its settings — the
// config file's tracing keys, with the standard OTEL_* environment
// variables filling what the file leaves unset — and the tracer provider
// that samples spans and exports them over OTLP (HTTP/protobuf or gRPC).
// What goes in the spans is the proxy's business.
//
//   - tracing.go: the settings (Resolve), the tracer provider (New), the
//     SDK's errors routed to the log.
//   - exporter.go: the OTLP exporters spans leave through (Exporters is
//     true), the OpenTelemetry project's, over HTTP/protobuf or gRPC.
//   - noexporter.go: in a build with -tags sturdy_notracing, none: the
//     exporters and the gRPC stack they link are left out (a quarter of the
//     process's memory), and Resolve refuses settings that turn tracing on.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The protocols spans are exported with.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// DefaultServiceName is service.name when neither the file nor
// OTEL_SERVICE_NAME sets one.
const DefaultServiceName = "sturdy"

// tracesPath is where an OTLP/HTTP collector takes spans.
const tracesPath = "/v1/traces"

// File is the config file's tracing section; a zero field (nil
// SampleRatio, nil Headers) is one the file does not set. It has
// config.Tracing's fields, so one converts to the other.
type File struct {
	Endpoint    string
	Protocol    string
	SampleRatio *float64
	ServiceName string
	Headers     map[string]string
}

// Settings are the tracing settings in force, the file's filled from the
// environment.
type Settings struct {
	// URL is where spans go: for http/protobuf the full URL spans are
	// posted to (…/v1/traces), for grpc the collector's URL.
	URL         string
	Protocol    string
	SampleRatio float64
	ServiceName string
	// Headers go with every export (nil: OTEL_EXPORTER_OTLP_HEADERS, read
	// by the exporter). Their values are secrets: never logged.
	Headers map[string]string
}

// Resolve returns the tracing settings f and the environment (getenv)
// make, and whether tracing is on. A key the file sets wins over its
// variable; OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (a full URL) or
// OTEL_EXPORTER_OTLP_ENDPOINT (a base URL) alone turns tracing on;
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turns it off
// whatever the file says. An error names the variable that is wrong. In
// a build without the exporters, settings that turn tracing on are an
// error too (ErrNoExporters).
func Resolve(f File, getenv func(string) string) (s Settings, on bool, err error) {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none") {
		return Settings{}, false, nil
	}
	s = Settings{Protocol: f.Protocol, ServiceName: f.ServiceName, Headers: f.Headers}
	if len(s.Headers) == 0 {
		s.Headers = nil // headers: {} sets none: OTEL_EXPORTER_OTLP_HEADERS still applies
	}
	if s.Protocol == "" {
		var name string
		name, s.Protocol = firstSet(getenv, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
		if s.Protocol == "" {
			s.Protocol = ProtocolHTTP
		} else if err := CheckProtocol(s.Protocol); err != nil {
			return Settings{}, false, fmt.Errorf("%s: %q: %v", name, s.Protocol, err)
		}
	}
	// A signal-specific endpoint is used as written; the general one is a
	// base URL.
	const tracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	var name string
	if s.URL = f.Endpoint; s.URL == "" {
		if name, s.URL = firstSet(getenv, tracesEndpoint, "OTEL_EXPORTER_OTLP_ENDPOINT"); s.URL == "" {
			return Settings{}, false, nil
		}
		if err := CheckEndpoint(s.URL); err != nil {
			return Settings{}, false, fmt.Errorf("%s: %v", name, err)
		}
	}
	if s.Protocol == ProtocolHTTP && name != tracesEndpoint && !strings.HasSuffix(s.URL, tracesPath) {
		s.URL = strings.TrimSuffix(s.URL, "/") + tracesPath
	}
	if s.SampleRatio, err = sampleRatio(f.SampleRatio, getenv); err != nil {
		return Settings{}, false, err
	}
	if s.ServiceName == "" {
		if s.ServiceName = getenv("OTEL_SERVICE_NAME"); s.ServiceName == "" {
			s.ServiceName = DefaultServiceName
		}
	}
	if !Exporters {
		if name == "" {
			return Settings{}, false, fmt.Errorf("%w: remove tracing.endpoint to run without tracing", ErrNoExporters)
		}
		return Settings{}, false, fmt.Errorf("%s: %w: unset it or set OTEL_SDK_DISABLED=true to run without tracing", name, ErrNoExporters)
	}
	return s, true, nil
}

// ErrNoExporters is why a build without the OTLP exporters (-tags
// sturdy_notracing) refuses settings that turn tracing on.
var ErrNoExporters = errors.New("this Sturdy was built without the OTLP exporters (-tags sturdy_notracing) " +
	"and cannot trace; a build without the tag can")

// CheckEndpoint reports what is wrong with a collector URL, if anything.
// It never quotes the URL: one from the environment may carry a token.
func CheckEndpoint(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case !strings.Contains(raw, "://"):
		return errors.New("no scheme: write it as http://host:port (e.g. http://127.0.0.1:4318)")
	case err != nil:
		return errors.New("not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("want http:// or https:// and the collector's address (e.g. http://127.0.0.1:4318)")
	case u.Host == "":
		return errors.New("the URL has no host")
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return errors.New("no query, fragment or user info in the URL (credentials go in headers)")
	}
	return nil
}

// sampleRatio is the file's sample_ratio, else OTEL_TRACES_SAMPLER's
// (always_on, always_off, traceidratio with OTEL_TRACES_SAMPLER_ARG; the
// parentbased_ forms alike: Sturdy always follows a sampled parent), else
// 1.
func sampleRatio(file *float64, getenv func(string) string) (float64, error) {
	if file != nil {
		return *file, nil
	}
	switch name := getenv("OTEL_TRACES_SAMPLER"); strings.TrimPrefix(name, "parentbased_") {
	case "", "always_on":
		return 1, nil
	case "always_off":
		return 0, nil
	case "traceidratio":
		arg := getenv("OTEL_TRACES_SAMPLER_ARG")
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || CheckRatio(r) != nil {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q: %v", arg, errRatio)
		}
		return r, nil
	default:
		return 0, fmt.Errorf("OTEL_TRACES_SAMPLER: %q: Sturdy samples always_on, always_off or traceidratio (parent-based)", name)
	}
}

// CheckProtocol reports an export protocol Sturdy does not speak.
func CheckProtocol(p string) error {
	if p != ProtocolHTTP && p != ProtocolGRPC {
		return errors.New("must be http/protobuf or grpc")
	}
	return nil
}

var errRatio = errors.New("must be a ratio from 0 to 1")

// CheckRatio reports a sample ratio outside 0 to 1.
func CheckRatio(r float64) error {
	if r < 0 || r > 1 {
		return errRatio
	}
	return nil
}

// firstSet returns the first of the variables that is set, and its value.
func firstSet(getenv func(string) string, names ...string) (name, value string) {
	for _, n := range names {
		if v := getenv(n); v != "" {
			return n, v
		}
	}
	return "", ""
}

// MaxAttributeBytes caps every span attribute's value (the SDK's
// AttributeValueLengthLimit; OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT may
// set it lower): a backstop, since the SDK truncates to a substring of
// the value given, which stays whole in memory. Callers copy what a
// client sent onto a span already bounded.
const MaxAttributeBytes = 1024

// Tracer is a running tracer provider: the spans it starts are sampled
// (a sampled parent always followed, the rest at the sample ratio) and
// exported in batches.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
}

// New starts a tracer exporting with s. version is service.version
// (empty: none). It does not connect: exports are attempted, and failures
// dropped, in the background.
func New(s Settings, version string) (*Tracer, error) {
	ctx := context.Background()
	exp, err := newExporter(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", s.ServiceName)}
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	// OTEL_RESOURCE_ATTRIBUTES adds to the resource; the service name is
	// the one resolved.
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithAttributes(attrs...))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	limits := sdktrace.NewSpanLimits() // OTEL_SPAN_* tune it, below MaxAttributeBytes
	if l := limits.AttributeValueLengthLimit; l < 0 || l > MaxAttributeBytes {
		limits.AttributeValueLengthLimit = MaxAttributeBytes
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp), // OTEL_BSP_* tune it
		sdktrace.WithRawSpanLimits(limits),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(s.SampleRatio))),
	)
	return &Tracer{provider: tp, tracer: tp.Tracer("sturdy")}, nil
}

// Tracer returns the tracer spans are started with.
func (t *Tracer) Tracer() trace.Tracer { return t.tracer }

// Shutdown exports the spans not yet exported, until ctx ends, and stops
// t: spans ended afterwards are dropped.
func (t *Tracer) Shutdown(ctx context.Context) error { return t.provider.Shutdown(ctx) }

// errorEvery bounds how often the SDK's errors are logged: a collector
// that is down fails every batch.
const errorEvery = 30 * time.Second

// LogErrors sends the OpenTelemetry SDK's errors (a collector that cannot
// be reached, spans dropped) to log instead of the standard logger: the
// first at once, then at most one per errorEvery, with how many were not
// logged meanwhile.
func LogErrors(log func(err error, suppressed int)) {
	var mu sync.Mutex
	var last time.Time
	suppressed := 0
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		mu.Lock()
		now := time.Now()
		if !last.IsZero() && now.Sub(last) < errorEvery {
			suppressed++
			mu.Unlock()
			return
		}
		n := suppressed
		last, suppressed = now, 0
		mu.Unlock()
		log(err, n)
	}))
}
