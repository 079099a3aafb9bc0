package events

import (
	"bytes"
	"testing"
)

func TestNext(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in   string
		event      string
		data       string
		n          int
		incomplete bool
	}{
		{name: "LF", in: "data: x\n\ndata: y\n\n", data: "x", n: 9},
		{name: "CRLF", in: "data: x\r\n\r\ndata: y", data: "x", n: 11},
		{name: "CR", in: "data: x\r\rdata: y", data: "x", n: 9},
		{name: "LF then CRLF blank line", in: "data: x\n\r\ndata: y\n\n", data: "x", n: 10},
		{name: "CRLF then LF blank line", in: "data: x\r\n\ndata: y\n\n", data: "x", n: 10},
		{name: "two data lines", in: "data: a\ndata: b\n\n", data: "a\nb", n: 17},
		{name: "named", in: "event: error\ndata: {}\n\n", event: "error", data: "{}", n: 23},
		{name: "comment only", in: ": ping\n\n", n: 8},
		{name: "no blank line yet", in: "data: x\n", incomplete: true},
		{name: "a CR that may be half of CRLF", in: "data: x\r\n\r", incomplete: true},
	}
	for _, tt := range tests {
		ev, n := Next(SSE, []byte(tt.in))
		if tt.incomplete {
			if n != 0 {
				t.Errorf("%s: took %d bytes of an incomplete event", tt.name, n)
			}
			continue
		}
		if n != tt.n || string(ev.Name) != tt.event || string(ev.Data) != tt.data {
			t.Errorf("%s: %q %q %d, want %q %q %d", tt.name, ev.Name, ev.Data, n, tt.event, tt.data, tt.n)
		}
	}
}

// BenchmarkNextComments: a run of comments is taken event by event
// in one pass each, not by searching the whole buffer every time.
func BenchmarkNextComments(b *testing.B) {
	buf := bytes.Repeat([]byte(": p\n\n"), 1<<16/5)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		for rest := buf; len(rest) > 0; {
			_, n := Next(SSE, rest)
			if n == 0 {
				break
			}
			rest = rest[n:]
		}
	}
}

// FuzzKindOf checks stream-kind detection never panics and is
// case-insensitive on the media type.
func FuzzKindOf(f *testing.F) {
	for _, s := range []string{"text/event-stream", "text/event-stream; charset=utf-8", "application/x-ndjson", "application/json", "", ";;"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, ct []byte) {
		if KindOf(ct) != KindOf(bytes.ToUpper(ct)) {
			t.Fatalf("KindOf(%q) depends on case", ct)
		}
	})
}

// TestLastReadsAnEventWithoutItsBlankLine: the last event of a stream,
// without its blank line (SSE) or line break (NDJSON), and none in bytes
// that are no event.
func TestLastReadsAnEventWithoutItsBlankLine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		kind Kind
		in   string
		data string
		n    int
	}{
		{SSE, "data: {\"a\":1}\n", `{"a":1}`, 14},
		{SSE, "data: {\"a\":1}", `{"a":1}`, 13},
		{NDJSON, `{"done":true}`, `{"done":true}`, 13},
		{SSE, "", "", 0},
	} {
		ev, n := Last(c.kind, []byte(c.in))
		if string(ev.Data) != c.data || n != c.n {
			t.Errorf("%q: %q %d, want %q %d", c.in, ev.Data, n, c.data, c.n)
		}
	}
}
