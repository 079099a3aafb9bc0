package proxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"sturdy/internal/upstreamtest"
)

const http10SSE = "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"

// TestCloseDelimitedStreams: an upstream body with neither length nor
// chunks ends only when its connection closes, so a cut looks like an
// end; Sturdy tells them apart by the stream's terminator.
func TestCloseDelimitedStreams(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, body  string
		interrupted bool
	}{
		{"chat completions with [DONE]", `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\ndata: [DONE]\n\n", false},
		{"chat completions cut", `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n", true},
		{"chat completions cut mid-event", `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n" + `data: {"choi`, true},
		{"framing only, cut", `data: {"choices":[]}` + "\n\n", true},
		{"responses completed", "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n", false},
		{"responses cut", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := startProxy(t, upstreamtest.StartRaw(t, http10SSE+tt.body), nil)
			resp, body := h.chat(`{"stream":true}`)
			if resp.StatusCode != 200 || resp.Proto != "HTTP/1.1" {
				t.Fatalf("%s %d", resp.Proto, resp.StatusCode)
			}
			interrupted := strings.Contains(string(body), `"code":"stream_interrupted"`)
			if interrupted != tt.interrupted || !strings.HasPrefix(string(body), tt.body) {
				t.Fatalf("interrupted %v, want %v: %q", interrupted, tt.interrupted, body)
			}
			if tt.interrupted && !strings.HasSuffix(string(body), "}\n\n") {
				t.Fatalf("the cut event was not finished before the error event: %q", body)
			}
			want := "ok"
			if tt.interrupted {
				want = "stream_interrupted"
			}
			if line := h.accessLines(1)[0]; line["outcome"] != want {
				t.Fatalf("logged %v, want %s", line["outcome"], want)
			}
		})
	}
}

func TestChunkedStreamWithoutTerminatorPassesAndIsCounted(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{"data: {\"a\":1}\n\n"}})
	h := startProxy(t, up.URL, nil)
	resp, body := h.chat(`{"stream":true}`)
	if resp.StatusCode != 200 || string(body) != "data: {\"a\":1}\n\n" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	var m dto.Metric
	_ = h.p.m.StreamsUnterminated.WithLabelValues("default").Write(&m)
	if m.GetCounter().GetValue() != 1 {
		t.Fatalf("sturdy_stream_unterminated_total = %v", m.GetCounter().GetValue())
	}
}

// TestHTTP10ClientGetsAContentLength: an HTTP/1.0 client cannot read
// chunks: a body of unknown length is read whole and reaches it with a
// Content-Length — with its error event when the stream failed.
func TestHTTP10ClientGetsAContentLength(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: upstreamtest.SSE("a", "b")},
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: upstreamtest.SSE("a")[:1], Fault: upstreamtest.Cut})
	h := startProxy(t, up.URL, nil)
	ask := func() (head, body string) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Length: 15\r\n\r\n{\"stream\":true}")
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		raw, err := io.ReadAll(bufio.NewReader(conn))
		if err != nil {
			t.Fatal(err)
		}
		head, body, _ = strings.Cut(string(raw), "\r\n\r\n")
		if !strings.HasPrefix(head, "HTTP/1.1 200") || strings.Contains(strings.ToLower(head), "transfer-encoding") ||
			!strings.Contains(head, "Content-Length: ") {
			t.Fatalf("%q", raw)
		}
		return head, body
	}
	if _, body := ask(); !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("whole stream: %q", body)
	}
	if _, body := ask(); !strings.Contains(body, `"code":"stream_interrupted"`) {
		t.Fatalf("cut stream: %q", body)
	}
	lines := h.accessLines(2)
	if lines[0]["outcome"] != "ok" || lines[1]["outcome"] != "stream_interrupted" {
		t.Fatalf("access lines %v", lines)
	}
}
