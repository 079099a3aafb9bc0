//go:build sturdy_notracing

package tracing

import (
	"context"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Exporters is false in a build with -tags sturdy_notracing: the OTLP
// exporters, and the gRPC stack only they link, are left out — about 7
// MiB of the process's peak memory and half the binary (bench/README.md,
// "Peak RSS, looked at again"). Resolve refuses settings that turn
// tracing on, so a config that asks for spans fails -check and startup
// and a reload that asks for them is rejected, instead of running
// without them.
const Exporters = false

// newExporter is never reached with settings Resolve gave; it refuses
// anyway.
func newExporter(context.Context, Settings) (sdktrace.SpanExporter, error) {
	return nil, ErrNoExporters
}
