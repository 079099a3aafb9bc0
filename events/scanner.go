// Package events is the stream grammar of streamed model replies — SSE
// (text/event-stream: chat completions, the Responses API) and NDJSON
// (Ollama) — read incrementally as their bytes pass through, without
// allocating. It knows framing, not meaning (what an event says is
// policy.Judge's): it imports nothing of Sturdy's.
//
//	frame.go    KindOf (a media type's framing), Next and Event (one whole
//	            event cut from held bytes, before the commit point), Last
//	            (the one a stream ends with, without its blank line)
//	scanner.go  Scanner: where a relayed stream stands (inside a line,
//	            inside an event) and whether its terminator went by;
//	            LineEnd
package events

import "bytes"

// Kind is a stream's framing.
type Kind uint8

// The framings a Scanner reads.
const (
	// SSE: lines of "field: value", events separated by a blank line.
	SSE Kind = iota + 1
	// NDJSON: one JSON value per line.
	NDJSON
)

// lineCap is how much of each line the Scanner keeps to look at: enough
// for a field name and the start of its value, where every terminator
// is told.
const lineCap = 256

// Scanner follows a stream fed to it with Write. Its zero value is not
// ready: call Reset with the stream's Kind first. It is not safe for
// concurrent use.
type Scanner struct {
	kind Kind
	// line holds the start of the current line (up to lineCap bytes);
	// lineLen is its full length so far.
	line    [lineCap]byte
	lineLen int
	// cr is set when the last byte was a \r (a \n after it ends nothing).
	cr bool
	// inEvent is set while an SSE event has lines but no blank line yet;
	// hasData once one of them was a data line.
	inEvent, hasData bool
	// event is the current SSE event's name ("event:" field), if any.
	event    [64]byte
	eventLen int
	// terminal is set when the current SSE event's name ends the stream;
	// done once a terminating data line (or NDJSON line) has ended.
	terminal, done bool
	events         int
	// sawLine is set once a line ended (the first may open with a byte
	// order mark).
	sawLine bool
}

// Reset makes s ready for a new stream of the given kind.
func (s *Scanner) Reset(kind Kind) { *s = Scanner{kind: kind} }

// Kind returns the framing s reads (0 before Reset).
func (s *Scanner) Kind() Kind { return s.kind }

// End tells s the stream ended: an unfinished last line counts as a line
// (a terminator written without its line break still ends the stream).
func (s *Scanner) End() {
	if s.lineLen > 0 {
		s.endLine(s.held())
	}
}

// Write feeds the next bytes of the stream. It never fails or allocates.
func (s *Scanner) Write(p []byte) (int, error) {
	s.feed(p, false)
	return len(p), nil
}

// Feed is Write that stops once the stream has ended (Ended): it returns
// how many bytes of p belong to the stream — all of them until its
// terminator's event (or line) is over, then none. What follows a
// terminator is not the stream's: a relay sends Feed's bytes and no more.
func (s *Scanner) Feed(p []byte) int { return s.feed(p, true) }

// Ended reports whether the stream's terminator went by and its event
// (SSE: up to its blank line) or line (NDJSON) is over: nothing after
// it belongs to the stream (but the \n of a line that ended in \r\n,
// which Feed still takes when it comes with the \r).
func (s *Scanner) Ended() bool { return s.done && s.lineLen == 0 && !s.inEvent }

// feed reads p; with stop it stops where the stream ended and returns
// the bytes read.
func (s *Scanner) feed(p []byte, stop bool) int {
	n := len(p)
	for len(p) > 0 {
		if s.cr && p[0] == '\n' { // the \n of a \r\n: the line already ended
			s.cr = false
			p = p[1:]
			continue
		}
		if stop && s.Ended() {
			return n - len(p)
		}
		s.cr = false
		i := LineEnd(p)
		if i < 0 {
			s.add(p)
			return n
		}
		s.cr = p[i] == '\r'
		if s.lineLen == 0 {
			s.endLine(p[:min(i, lineCap)]) // the whole line is in p: read in place
		} else {
			s.add(p[:i])
			s.endLine(s.held())
		}
		p = p[i+1:]
	}
	return n - len(p)
}

// LineEnd returns the index of p's first line break ('\r' or '\n'), or
// -1. Two vectorized byte scans are several times faster on stream
// lines than bytes.IndexAny's loop over every byte.
func LineEnd(p []byte) int {
	i := bytes.IndexByte(p, '\n')
	before := p
	if i >= 0 {
		before = p[:i]
	}
	if j := bytes.IndexByte(before, '\r'); j >= 0 {
		return j
	}
	return i
}

// add appends line bytes, keeping the first lineCap.
func (s *Scanner) add(b []byte) {
	if s.lineLen < lineCap {
		copy(s.line[s.lineLen:], b)
	}
	s.lineLen += len(b)
}

// held is the start of the line held across Writes (up to lineCap bytes).
func (s *Scanner) held() []byte { return s.line[:min(s.lineLen, lineCap)] }

// endLine handles the line just ended (its first lineCap bytes).
func (s *Scanner) endLine(line []byte) {
	s.lineLen = 0
	if !s.sawLine {
		s.sawLine = true
		line = bytes.TrimPrefix(line, []byte("\xEF\xBB\xBF"))
	}
	if s.kind == NDJSON {
		if len(bytes.TrimSpace(line)) > 0 {
			s.events++
			if ndjsonFinal(line) {
				s.done = true
			}
		}
		return
	}
	if len(line) == 0 { // a blank line ends the event
		if s.hasData {
			s.events++
		}
		s.inEvent, s.hasData, s.terminal, s.eventLen = false, false, false, 0
		return
	}
	s.inEvent = true
	name, value := field(line)
	switch string(name) {
	case "event":
		s.eventLen = copy(s.event[:], value)
		s.terminal = terminalEvent(value)
		s.done = s.done || s.terminal && s.hasData // its data came first
	case "data":
		s.hasData = true
		if s.terminal || string(bytes.TrimSpace(value)) == "[DONE]" || mayEnd(value) && terminalEvent(jsonType(value)) {
			s.done = true
		}
	}
}

// field splits an SSE line into its name and value ("data: x" → data, x).
func field(line []byte) (name, value []byte) {
	name, value, _ = bytes.Cut(line, []byte(":"))
	value, _ = bytes.CutPrefix(value, []byte(" "))
	return name, value
}

// terminalEvent reports whether an event type ends the stream: the
// Responses API's completed, incomplete or failed, the Messages API's
// message_stop, or an error.
func terminalEvent(name []byte) bool {
	switch string(name) {
	case "response.completed", "response.incomplete", "response.failed", "message_stop", "error":
		return true
	}
	return false
}

// mayEnd reports whether a data line could be a terminal event at all:
// a "type" key, and "response.…, "message_stop" or "error" somewhere — a
// search much cheaper than jsonType's scan, which most lines (chat
// chunks) never need.
func mayEnd(v []byte) bool {
	return hasTypeKey(v) &&
		(bytes.Contains(v, []byte(`"response.`)) || bytes.Contains(v, []byte(`"message_stop"`)) || bytes.Contains(v, []byte(`"error"`)))
}

// hasTypeKey is bytes.Contains(v, `"type"`), found from its 'y': a chat
// chunk's keys have none, where a '"' (bytes.Index's anchor) starts each
// of them — a vectorized byte search and a check per 'y'
// (BenchmarkScannerChat's chunk: 39 → 5.5 ns).
func hasTypeKey(v []byte) bool {
	for i := 0; ; i++ {
		j := bytes.IndexByte(v[i:], 'y')
		if j < 0 {
			return false
		}
		if i += j; i >= 2 && i+4 <= len(v) && string(v[i-2:i+4]) == `"type"` {
			return true
		}
	}
}

// jsonType returns the string value of the top-level "type" key of a
// JSON object, as far as the start of it (lineCap bytes) shows; nil
// otherwise.
func jsonType(v []byte) []byte {
	return topLevelString(v, "type")
}

// topLevelString finds key among the keys of the top-level object in v
// (not inside a nested value) and returns its value when it is a string
// of unescaped characters; nil otherwise. It scans, it does not parse:
// enough to tell a known value at the start of an event.
func topLevelString(v []byte, key string) []byte {
	depth, inString, escaped, start := 0, false, false, -1
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
			if depth == 1 && string(v[start:i]) == key {
				if val, ok := stringAfterColon(v[i+1:]); ok {
					return val
				}
			}
		case inString:
		case c == '"':
			inString, start = true, i+1
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
		}
	}
	return nil
}

// stringAfterColon reads `: "value"` at the start of rest (a key just
// ended): ok only for a string value, unescaped characters only.
func stringAfterColon(rest []byte) (value []byte, ok bool) {
	rest = bytes.TrimLeft(rest, " \t")
	if rest, ok = bytes.CutPrefix(rest, []byte(":")); !ok {
		return nil, false
	}
	rest = bytes.TrimLeft(rest, " \t")
	if rest, ok = bytes.CutPrefix(rest, []byte(`"`)); !ok {
		return nil, false
	}
	end := bytes.IndexAny(rest, `"\`)
	if end < 0 || rest[end] != '"' {
		return nil, false
	}
	return rest[:end], true
}

// ndjsonFinal reports whether an NDJSON line ends an Ollama stream: it
// says "done": true, or it is an {"error": …} line.
func ndjsonFinal(line []byte) bool {
	if i := bytes.Index(line, []byte(`"done"`)); i >= 0 {
		rest := bytes.TrimLeft(line[i+len(`"done"`):], " \t")
		if rest, ok := bytes.CutPrefix(rest, []byte(":")); ok && bytes.HasPrefix(bytes.TrimLeft(rest, " \t"), []byte("true")) {
			return true
		}
	}
	trimmed := bytes.TrimLeft(line, " \t{")
	return bytes.HasPrefix(trimmed, []byte(`"error"`))
}

// Done reports whether the stream's terminator has gone by: SSE's
// "data: [DONE]" (chat completions), a terminal Responses API event
// (response.completed, response.incomplete, response.failed, error), the
// Messages API's message_stop (or error), or an NDJSON line with "done":
// true or an "error".
func (s *Scanner) Done() bool { return s.done }

// InLine reports whether the bytes so far end inside a line.
func (s *Scanner) InLine() bool { return s.lineLen > 0 }

// InEvent reports whether the bytes so far end inside an SSE event: some
// of its lines ended, the blank line that ends it has not come (a line
// still being read is InLine).
func (s *Scanner) InEvent() bool { return s.inEvent }

// Events counts the events with data (SSE) or the lines (NDJSON) that
// ended so far.
func (s *Scanner) Events() int { return s.events }

// Event returns the name of the SSE event being read ("event:" field; up
// to 64 bytes), empty when it has none yet. It is valid until the next
// Write.
func (s *Scanner) Event() []byte { return s.event[:s.eventLen] }
