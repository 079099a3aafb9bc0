package events

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func TestScannerTerminators(t *testing.T) {
	tests := []struct {
		name   string
		kind   Kind
		stream string
		done   bool
	}{
		{"chat completions", SSE, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", true},
		{"chat completions, no space, CRLF", SSE, "data:{}\r\n\r\ndata:[DONE]\r\n\r\n", true},
		{"[DONE] line without its blank line", SSE, "data: {}\n\ndata: [DONE]\n", true},
		{"cut before [DONE]", SSE, "data: {\"choices\":[]}\n\n", false},
		{"[DONE] cut mid-line", SSE, "data: {}\n\ndata: [DO", false},
		{"responses completed", SSE, "event: response.created\ndata: {\"type\":\"response.created\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\"}\n\n", true},
		{"responses completed, data only", SSE, "data: {\"type\":\"response.completed\",\"response\":{}}\n\n", true},
		{"responses incomplete", SSE, "event: response.incomplete\ndata: {}\n\n", true},
		{"responses failed", SSE, "event: response.failed\ndata: {}\n\n", true},
		{"responses error event", SSE, "event: error\ndata: {\"type\":\"error\",\"code\":\"x\"}\n\n", true},
		{"terminal event name without data yet", SSE, "event: response.completed\n", false},
		{"text delta only", SSE, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"[DONE]\"}\n\n", false},
		{"comment is no terminator", SSE, ": ping\n\n", false},
		{"messages stop", SSE, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true},
		{"messages stop, data only", SSE, "data: {\"type\":\"message_stop\"}\n\n", true},
		{"messages cut before its stop", SSE, "event: message_start\ndata: {}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"message_stop\"}}\n\n", false},
		{"messages error event", SSE, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n", true},
		{"ollama done", NDJSON, "{\"message\":{\"content\":\"a\"},\"done\":false}\n{\"done\": true,\"eval_count\":3}\n", true},
		{"ollama cut", NDJSON, "{\"message\":{\"content\":\"a\"},\"done\":false}\n", false},
		{"ollama error", NDJSON, "{\"error\":\"model not found\"}\n", true},
		{"a nested type is not the event's", SSE, "data: {\"choices\":[{\"delta\":{}}],\"obj\":{\"type\":\"error\"}}\n\n", false},
		{"a type value that looks like a key", SSE, "data: {\"a\":\"type\",\"b\":\"error\"}\n\n", false},
		{"escaped quotes", SSE, "data: {\"x\":\"\\\"type\\\":\\\"error\\\"\",\"type\":\"response.completed\"}\n\n", true},
		{"event name after its data", SSE, "data: {}\nevent: response.completed\n\n", true},
		{"byte order mark", SSE, "\xEF\xBB\xBFevent: response.completed\ndata: {}\n\n", true},
	}
	for _, tt := range tests {
		var s Scanner
		s.Reset(tt.kind)
		_, _ = s.Write([]byte(tt.stream))
		if s.Done() != tt.done {
			t.Errorf("%s: Done = %v, want %v", tt.name, s.Done(), tt.done)
		}
	}
}

func TestScannerEndCountsAnUnfinishedLastLine(t *testing.T) {
	for _, tt := range []struct {
		kind   Kind
		stream string
	}{{SSE, "data: {}\n\ndata: [DONE]"}, {NDJSON, "{\"done\":false}\n{\"done\":true}"}} {
		var s Scanner
		s.Reset(tt.kind)
		_, _ = s.Write([]byte(tt.stream))
		if s.Done() {
			t.Fatalf("%q: done before End", tt.stream)
		}
		s.End()
		if !s.Done() {
			t.Fatalf("%q: the terminator on the last line, without its line break, was missed", tt.stream)
		}
	}
}

func TestScannerPosition(t *testing.T) {
	var s Scanner
	s.Reset(SSE)
	for _, step := range []struct {
		feed            string
		inLine, inEvent bool
		events          int
	}{
		{"data: {\"a\"", true, false, 0},
		{":1}\n", false, true, 0},
		{"\n", false, false, 1},
		{"event: response.created\r", false, true, 1},
		{"\n", false, true, 1}, // the \n of \r\n ends nothing more
		{"data: x\r\n\r\n", false, false, 2},
	} {
		_, _ = s.Write([]byte(step.feed))
		if s.InLine() != step.inLine || s.InEvent() != step.inEvent || s.Events() != step.events {
			t.Fatalf("after %q: in line %v, in event %v, events %d", step.feed, s.InLine(), s.InEvent(), s.Events())
		}
	}
}

func TestScannerDoesNotAllocate(t *testing.T) {
	var s Scanner
	chunk := []byte("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n")
	s.Reset(SSE)
	if n := testing.AllocsPerRun(1000, func() { _, _ = s.Write(chunk) }); n != 0 {
		t.Fatalf("%v allocations per event", n)
	}
}

// reference reads a whole stream at once, the simple way, for the fuzzer
// to hold the incremental Scanner against.
func reference(kind Kind, stream string) (done, inLine, inEvent bool) {
	lines := regexp.MustCompile("\r\n|\r|\n").Split(stream, -1)
	last := lines[len(lines)-1] // the unfinished line ("" when the stream ends on a line break)
	inLine = last != ""
	terminal, hasData := false, false
	for i, line := range lines[:len(lines)-1] {
		if i == 0 {
			line = strings.TrimPrefix(line, "\xEF\xBB\xBF")
		}
		if kind == NDJSON {
			done = done || ndjsonFinal([]byte(truncate(line)))
			continue
		}
		line = truncate(line)
		if line == "" {
			inEvent, terminal, hasData = false, false, false
			continue
		}
		inEvent = true
		name, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch name {
		case "event":
			terminal = terminalEvent([]byte(value))
			done = done || terminal && hasData
		case "data":
			hasData = true
			done = done || terminal || strings.TrimSpace(value) == "[DONE]" || terminalEvent(jsonType([]byte(value)))
		}
	}
	return done, inLine, inEvent
}

func truncate(line string) string { return line[:min(len(line), lineCap)] }

// FuzzScanner feeds a stream in the pieces the fuzzer picks: the state
// must not depend on where the stream was split, and must agree with a
// whole-stream reading.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{"data: a\n\ndata: [DONE]\n\n", "event: response.completed\r\ndata: {}\r\n\r\n",
		"data: {\"type\":\"response.failed\"}\r\r", ": ping\n\ndata: x", "{\"done\":true}\n",
		"\xEF\xBB\xBFevent: response.completed\ndata: {}\n\n", "data: {}\nevent: error\n\n"} {
		f.Add(s, uint8(3), false)
	}
	f.Fuzz(func(t *testing.T, stream string, step uint8, ndjson bool) {
		kind := SSE
		if ndjson {
			kind = NDJSON
		}
		var whole, pieces Scanner
		whole.Reset(kind)
		pieces.Reset(kind)
		_, _ = whole.Write([]byte(stream))
		n := int(step%16) + 1
		for i := 0; i < len(stream); i += n {
			_, _ = pieces.Write([]byte(stream[i:min(i+n, len(stream))]))
		}
		if whole.Done() != pieces.Done() || whole.InLine() != pieces.InLine() || whole.InEvent() != pieces.InEvent() ||
			whole.Events() != pieces.Events() {
			t.Fatalf("split every %d bytes, %q reads differently", n, stream)
		}
		done, inLine, inEvent := reference(kind, stream)
		if whole.Done() != done || whole.InLine() != inLine || (kind == SSE && whole.InEvent() != inEvent) {
			t.Fatalf("%q: done %v in line %v in event %v; the whole-stream reading says %v %v %v",
				stream, whole.Done(), whole.InLine(), whole.InEvent(), done, inLine, inEvent)
		}
	})
}

// BenchmarkScannerChat follows a chat completions stream as the proxy
// relays it: one chunk per Write.
func BenchmarkScannerChat(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}` + "\n\n")
	var s Scanner
	s.Reset(SSE)
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.Write(chunk)
	}
}

// TestHasTypeKey: hasTypeKey is bytes.Contains(v, `"type"`).
func TestHasTypeKey(t *testing.T) {
	for _, v := range []string{"", "y", `"type"`, `type"`, `"typ`, `{"type":"x"}`, `{"a":"yyy","type":1}`, `"ttype"`, `"types"`,
		`yy"type"yy`, `{"content":"Sturdy"}`, `"type`, `ype"`, `x"type"`} {
		if got, want := hasTypeKey([]byte(v)), bytes.Contains([]byte(v), []byte(`"type"`)); got != want {
			t.Errorf("hasTypeKey(%q) = %v, want %v", v, got, want)
		}
	}
}

// FuzzHasTypeKey: hasTypeKey agrees with bytes.Contains on any input.
func FuzzHasTypeKey(f *testing.F) {
	for _, v := range []string{`{"type":"response.completed"}`, `"ty"type"pe"`, "yyyy"} {
		f.Add([]byte(v))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		if hasTypeKey(v) != bytes.Contains(v, []byte(`"type"`)) {
			t.Fatalf("hasTypeKey(%q) disagrees with bytes.Contains", v)
		}
	})
}

// TestLineEnd: the first '\r' or '\n', whichever comes first, as
// bytes.IndexAny(p, "\r\n") finds it.
func TestLineEnd(t *testing.T) {
	for _, p := range []string{"", "no break", "a\nb", "a\r\nb", "a\rb\n", "ab\n\r", "\n", "\r", "x\ry\rz", strings.Repeat("data ", 40) + "\n\n"} {
		if got, want := LineEnd([]byte(p)), bytes.IndexAny([]byte(p), "\r\n"); got != want {
			t.Errorf("LineEnd(%q) = %d, want %d", p, got, want)
		}
	}
}

// TestFeedStopsAtTheStreamsEnd: what follows a terminator's event (or
// line) is not the stream's, in one write or split anywhere.
func TestFeedStopsAtTheStreamsEnd(t *testing.T) {
	tests := []struct {
		name        string
		kind        Kind
		stream, end string // end: what Feed must leave out
	}{
		{"[DONE] then more", SSE, "data: {}\n\ndata: [DONE]\n\n", "data: {\"more\":1}\n\ndata: [DONE]\n\n"},
		{"CRLF", SSE, "data: {}\r\n\r\ndata: [DONE]\r\n\r\n", "data: x\r\n\r\n"},
		{"CR only", SSE, "data: {}\r\rdata: [DONE]\r\r", "data: x\r\r"},
		{"responses completed then more", SSE, "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n", "event: response.output_text.delta\ndata: {}\n\n"},
		{"ollama done then more", NDJSON, "{\"done\":false}\n{\"done\":true}\n", "{\"done\":false,\"message\":{}}\n"},
		{"no end", SSE, "data: {}\n\ndata: {}\n\n", ""},
	}
	for _, tt := range tests {
		all := tt.stream + tt.end
		for split := 0; split <= len(all); split++ {
			var s Scanner
			s.Reset(tt.kind)
			n := s.Feed([]byte(all[:split]))
			n += s.Feed([]byte(all[split:]))
			if got := all[:n]; got != tt.stream && !(tt.end == "" && got == all) {
				t.Fatalf("%s, split at %d: Feed kept %q, want %q", tt.name, split, got, tt.stream)
			}
			if s.Ended() != (tt.end != "") {
				t.Fatalf("%s, split at %d: Ended %v", tt.name, split, s.Ended())
			}
		}
	}
}
