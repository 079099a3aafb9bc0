//go:build !sturdy_notracing

package tracing

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Exporters is whether this build exports spans: false in one built
// with -tags sturdy_notracing (noexporter.go).
const Exporters = true

// newExporter returns the OTLP exporter s asks for. It does not connect;
// the exporter's own OTEL_EXPORTER_OTLP_* variables (certificates,
// timeout, compression) apply.
func newExporter(ctx context.Context, s Settings) (sdktrace.SpanExporter, error) {
	switch s.Protocol {
	case ProtocolGRPC:
		g := []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(s.URL)}
		if s.Headers != nil {
			g = append(g, otlptracegrpc.WithHeaders(s.Headers))
		}
		return otlptracegrpc.New(ctx, g...)
	case ProtocolHTTP, "":
		h := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(s.URL)}
		if s.Headers != nil {
			h = append(h, otlptracehttp.WithHeaders(s.Headers))
		}
		return otlptracehttp.New(ctx, h...)
	}
	return nil, fmt.Errorf("unknown protocol %q", s.Protocol)
}
