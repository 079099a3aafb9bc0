package events

import (
	"bytes"
	"slices"
)

// Event is one complete stream event as Next read it: an SSE event's
// name ("event:" field, nil when absent) and its data lines joined with
// "\n", or an NDJSON line as Data. Both alias the bytes Next was given,
// except for an SSE event of several data lines, which is joined into a
// new slice.
type Event struct {
	Name []byte
	Data []byte
}

// KindOf tells a stream's framing from its media type: SSE, NDJSON, or 0
// for anything else (whose failure can only abort the connection). The
// media type is matched without its parameters and without regard to
// case.
func KindOf(contentType []byte) Kind {
	mt, _, _ := bytes.Cut(contentType, []byte(";"))
	mt = bytes.TrimSpace(mt)
	switch {
	case bytes.EqualFold(mt, []byte("text/event-stream")):
		return SSE
	case bytes.EqualFold(mt, []byte("application/x-ndjson")), bytes.EqualFold(mt, []byte("application/ndjson")),
		bytes.EqualFold(mt, []byte("application/jsonl")), bytes.EqualFold(mt, []byte("application/x-jsonlines")):
		return NDJSON
	}
	return 0
}

// Last reads the event b holds as a stream ends, written without its
// blank line (or an NDJSON line without its break); n is 0 when b holds
// none.
func Last(kind Kind, b []byte) (ev Event, n int) {
	ev, n = Next(kind, append(slices.Clip(b), "\n\n"...))
	return ev, min(n, len(b))
}

// Next returns the first complete event in b — an SSE event up to its
// blank line, or an NDJSON line — and the bytes it takes; n is 0 when b
// holds no complete event yet. An SSE event's data lines are joined with
// "\n" (a single one is not copied); Data is nil for an event with none
// (a comment, a blank NDJSON line).
func Next(kind Kind, b []byte) (ev Event, n int) {
	if kind == NDJSON {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return ev, 0
		}
		if line := bytes.TrimSpace(b[:i]); len(line) > 0 {
			ev.Data = line
		}
		return ev, i + 1
	}
	end, next := eventEnd(b)
	if end < 0 {
		return ev, 0
	}
	for rest := b[:end]; len(rest) > 0; {
		i := LineEnd(rest)
		if i < 0 {
			i = len(rest)
		}
		line := rest[:i]
		rest = rest[min(i+1, len(rest)):]
		if len(line) == 0 {
			continue // the "\n" of a "\r\n", or a blank line
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value, _ = bytes.CutPrefix(value, []byte(" "))
		switch string(name) {
		case "event":
			ev.Name = value
		case "data":
			if ev.Data == nil {
				ev.Data = value
			} else {
				ev.Data = append(append(append([]byte(nil), ev.Data...), '\n'), value...)
			}
		}
	}
	return ev, next
}

// eventEnd finds the blank line that ends b's first SSE event, in one
// pass, with lines ended by "\r\n", "\n" or "\r" in any mix: end is where
// the blank line starts, next where the following event does; end is -1
// when b holds no complete event yet.
func eventEnd(b []byte) (end, next int) {
	lineStart := 0
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\n' && c != '\r' {
			continue
		}
		j := i + 1
		if c == '\r' && j < len(b) && b[j] == '\n' {
			j++
		}
		if i == lineStart {
			if c == '\r' && j == len(b) {
				return -1, 0 // its "\n" may be on its way
			}
			return lineStart, j
		}
		lineStart, i = j, j-1
	}
	return -1, 0
}
