// Package otlptest is an in-process OTLP/HTTP trace receiver on a
// loopback port: what tests and the bench point Sturdy's tracing at, to
// read back the spans it exported.
package otlptest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Span is one exported span, decoded.
type Span struct {
	Name                  string
	TraceID, ID, ParentID string // hex; ParentID empty for a root
	Kind                  tracepb.Span_SpanKind
	Start, End            time.Time
	Attrs                 map[string]any
	Events                []Event
	StatusCode            tracepb.Status_StatusCode
	StatusMessage         string
	// Resource holds the exporting process's resource attributes.
	Resource map[string]any
}

// Event is a span event, decoded.
type Event struct {
	Name  string
	Time  time.Time
	Attrs map[string]any
}

// Event returns s's first event named name, and whether it has one.
func (s Span) Event(name string) (Event, bool) {
	for _, e := range s.Events {
		if e.Name == name {
			return e, true
		}
	}
	return Event{}, false
}

// Receiver takes OTLP exports: over HTTP (protobuf) at URL/v1/traces, or
// over gRPC (StartGRPC).
type Receiver struct {
	// URL is the collector's base URL (http://127.0.0.1:port).
	URL string
	// keep, when false, makes it a sink: exports are taken and dropped.
	keep    bool
	srv     *http.Server
	grpc    *grpc.Server
	mu      sync.Mutex
	spans   []Span
	raw     bytes.Buffer
	headers []http.Header
}

// New starts a receiver on a free loopback port; keep says whether it
// keeps what it receives (else it is a sink that drops every export).
func New(keep bool) (*Receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Receiver{URL: "http://" + ln.Addr().String(), keep: keep}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// Start runs a receiver that keeps what it gets until t ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r, err := New(true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// Close stops the receiver.
func (r *Receiver) Close() {
	if r.srv != nil {
		_ = r.srv.Close()
	}
	if r.grpc != nil {
		r.grpc.Stop()
	}
}

// StartGRPC runs an OTLP/gRPC receiver that keeps what it gets until t
// ends; its URL is http://127.0.0.1:port.
func StartGRPC(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{URL: "http://" + ln.Addr().String(), keep: true, grpc: grpc.NewServer()}
	coltracepb.RegisterTraceServiceServer(r.grpc, grpcService{r: r})
	go func() { _ = r.grpc.Serve(ln) }()
	t.Cleanup(r.Close)
	return r
}

type grpcService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (g grpcService) Export(ctx context.Context, ex *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	raw, _ := proto.Marshal(ex)
	h := http.Header{}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for k, vs := range md {
			for _, v := range vs {
				h.Add(k, v)
			}
		}
	}
	g.r.store(ex, raw, h)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "POST /v1/traces", http.StatusNotFound)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	if !r.keep { // a sink: what it costs to take the export, no more
		_, _ = io.Copy(io.Discard, body)
		r.ok(w)
		return
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var ex coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &ex); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.store(&ex, b, req.Header.Clone())
	r.ok(w)
}

// store keeps one export: its spans, bytes and headers.
func (r *Receiver) store(ex *coltracepb.ExportTraceServiceRequest, raw []byte, h http.Header) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range ex.ResourceSpans {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, decode(s, res))
			}
		}
	}
	r.raw.Write(raw)
	r.headers = append(r.headers, h)
}

// ok answers an export: all spans taken.
func (r *Receiver) ok(w http.ResponseWriter) {
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func decode(s *tracepb.Span, res map[string]any) Span {
	d := Span{Name: s.Name, TraceID: hex.EncodeToString(s.TraceId), ID: hex.EncodeToString(s.SpanId),
		ParentID: hex.EncodeToString(s.ParentSpanId), Kind: s.Kind,
		Start: time.Unix(0, int64(s.StartTimeUnixNano)), End: time.Unix(0, int64(s.EndTimeUnixNano)),
		Attrs: attrs(s.Attributes), StatusCode: s.GetStatus().GetCode(), StatusMessage: s.GetStatus().GetMessage(),
		Resource: res}
	for _, e := range s.Events {
		d.Events = append(d.Events, Event{Name: e.Name, Time: time.Unix(0, int64(e.TimeUnixNano)), Attrs: attrs(e.Attributes)})
	}
	return d
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		switch v := kv.Value.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = v.IntValue
		case *commonpb.AnyValue_BoolValue:
			m[kv.Key] = v.BoolValue
		case *commonpb.AnyValue_DoubleValue:
			m[kv.Key] = v.DoubleValue
		default:
			m[kv.Key] = fmt.Sprint(kv.Value)
		}
	}
	return m
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Raw returns every export's bytes as received (for scanning them for
// what must not be there).
func (r *Receiver) Raw() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.raw.Bytes())
}

// Headers returns the HTTP headers of each export.
func (r *Receiver) Headers() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.headers...)
}

// Await returns the spans received once done says they are all there,
// failing t if that takes longer than within.
func (r *Receiver) Await(t testing.TB, within time.Duration, done func([]Span) bool) []Span {
	t.Helper()
	for end := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		spans := r.Spans()
		if done(spans) {
			return spans
		}
		if time.Now().After(end) {
			t.Fatalf("spans not in after %s; have %d: %v", within, len(spans), names(spans))
			return nil
		}
	}
}

func names(spans []Span) []string {
	var n []string
	for _, s := range spans {
		n = append(n, s.Name)
	}
	return n
}

// Trace returns the spans of one trace.
func Trace(spans []Span, traceID string) []Span {
	var out []Span
	for _, s := range spans {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Children returns the spans whose parent is id, in start order.
func Children(spans []Span, id string) []Span {
	var out []Span
	for _, s := range spans {
		if s.ParentID == id {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b Span) int { return a.Start.Compare(b.Start) })
	return out
}
