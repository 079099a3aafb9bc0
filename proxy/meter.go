package proxy

import (
	"bytes"

	"github.com/tidwall/gjson"

	"sturdy/events"
	"sturdy/policy"
)

// meter reads what a reply used as it goes to the client: the usage its
// events tell (policy.ReadUsage of each event that tells one), the model
// it names (first, and as its usage is told), and the bytes of text it
// carried — what a stream cut before its usage is settled by (÷ 4, as a
// request's text is estimated: policy.EstimateTokens). It runs only for a request whose
// usage something needs (outbound.metered: a budget, a tokens_per_minute,
// a trace).
//
// It is fed the upstream's events: those a followed stream frames
// (stream.follow), or the bytes relayed as they come, framed here
// (feed). A rescue's continuation is metered apart from the attempt it
// took over from (cutOver): that one's output is its characters ÷ 4.
type meter struct {
	api  policy.API
	kind events.Kind
	// pending holds the relayed bytes of an unfinished event (of a body
	// of no known framing, its last bytes), at most meterHold of them.
	pending []byte
	// over says pending holds the end of an event that outgrew
	// meterHold, dropped how much of it went.
	over    bool
	dropped int
	// long reads the usage of the event (or the body of no framing) that
	// outgrew meterHold, from its first byte: by its place, as whole
	// events' is read (policy.UsageReader), not from its kept end.
	long  policy.UsageReader
	usage policy.Usage
	model string
	text  int // bytes of text carried
	// prior is the output of the attempts a continuation took over from.
	prior int64
}

// usage is what a reply says of the model that answered and the tokens
// it used; streamed is its output as its text's characters ÷ 4 (what a
// reply that told no usage is charged).
type usage struct {
	model string
	policy.Usage
	streamed int64
}

// meteredUsage is the usage of ex's answer, as its stream's meter (or,
// for a reply set whole, commit's) read it.
func meteredUsage(ex *exchange) usage {
	if !ex.st.metering {
		return usage{}
	}
	m := &ex.st.meter
	m.end()
	return m.result()
}

// withoutUsage is a whole SSE body without the usage chunk Sturdy asked
// for (policy.UsageChunk), in place.
func withoutUsage(body []byte) []byte {
	out, off := body[:0], 0
	for off < len(body) {
		ev, n := events.Next(events.SSE, body[off:])
		if n == 0 {
			ev, n = events.Last(events.SSE, body[off:])
			if n == 0 || !policy.UsageChunk(ev.Data) {
				out = append(out, body[off:]...)
			}
			break
		}
		if !policy.UsageChunk(ev.Data) {
			out = append(out, body[off:off+n]...)
		}
		off += n
	}
	return out
}

// meterHold bounds what a meter holds of one event: a usage is told in
// its last bytes, so an event past it keeps only its end.
const meterHold = 8 << 10

// start makes m ready for a reply of api framed as kind.
func (m *meter) start(api policy.API, kind events.Kind) {
	*m = meter{api: api, kind: kind, pending: m.pending[:0]}
}

// feed meters relayed bytes b.
func (m *meter) feed(b []byte) {
	m.pending = append(m.pending, b...)
	off := 0
	for m.kind != 0 {
		if m.over { // the end of an event that outgrew meterHold
			end := overEnd(m.kind, m.pending[off:])
			if end < 0 {
				break
			}
			m.longEvent(m.pending[off : off+end])
			off += end
			continue
		}
		ev, n := events.Next(m.kind, m.pending[off:])
		if n == 0 {
			break
		}
		m.event(ev.Data)
		off += n
	}
	m.pending = m.pending[:copy(m.pending, m.pending[off:])]
	if over := len(m.pending) - meterHold; over > 0 { // an event past the bound: its end is kept
		drop := over + meterHold/2
		if m.dropped == 0 {
			m.long.Start(m.api)
		}
		m.long.Feed(m.pending[:drop])
		m.pending = m.pending[:copy(m.pending, m.pending[drop:])]
		m.over, m.dropped = m.kind != 0, m.dropped+drop
	}
}

// overEnd is where the event whose end pending holds ends (after its
// blank line, or an NDJSON line's break); -1: not in b.
func overEnd(kind events.Kind, b []byte) int {
	if kind == events.NDJSON {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			return i + 1
		}
		return -1
	}
	end := -1
	for _, sep := range [...]string{"\n\n", "\n\r\n", "\r\r"} { // a blank line, however its lines end
		if i := bytes.Index(b, []byte(sep)); i >= 0 && (end < 0 || i+len(sep) < end) {
			end = i + len(sep)
		}
	}
	return end
}

// longEvent meters the end of an event that outgrew meterHold: the usage
// it tells, else its bytes as characters of text (a long delta).
func (m *meter) longEvent(tail []byte) {
	m.long.Feed(tail)
	if !m.tell(m.long.Usage()) {
		m.text += m.dropped + len(tail)
	}
	m.over, m.dropped = false, 0
}

// end meters what is left once the reply ended: a last event without its
// blank line, or a body of no framing.
func (m *meter) end() {
	rest := bytes.TrimSpace(m.pending)
	m.pending = m.pending[:0]
	switch {
	case m.over:
		m.longEvent(rest)
		return
	case m.kind == 0 && m.dropped > 0: // the end of a long body: its usage, no text
		m.long.Feed(rest)
		m.tell(m.long.Usage())
		return
	}
	m.event(bytes.TrimSpace(bytes.TrimPrefix(rest, []byte("data:"))))
}

// event meters one event's data (a whole body, for a reply read whole).
func (m *meter) event(data []byte) {
	if len(data) == 0 || data[0] != '{' {
		return // [DONE], a comment, an empty event
	}
	told := m.read(data)
	for _, path := range replyText[m.api] {
		if v := gjson.GetBytes(data, path); v.Type == gjson.String {
			m.text += len(v.Str)
			break // an event carries one kind of text
		}
	}
	if m.model != "" && !told {
		return // the model is read once, and again from the usage's event (a stream's last word on it)
	}
	if v := gjson.GetBytes(data, "model"); v.Type == gjson.String {
		m.model = v.Str
	} else if v := gjson.GetBytes(data, "message.model"); v.Type == gjson.String { // Anthropic's message_start
		m.model = v.Str
	}
}

// read meters the usage b tells, if any, and reports whether it told one.
func (m *meter) read(b []byte) bool {
	if bytes.Contains(b, []byte(`"usage":`)) || m.api == policy.APIOllama && bytes.Contains(b, []byte(`eval_count"`)) {
		return m.tell(policy.ReadUsage(m.api, b))
	}
	return false
}

// tell takes usage u, when it was told, and reports whether it was.
// Within one reply the counts only grow (Anthropic's message_delta is
// cumulative).
func (m *meter) tell(u policy.Usage) bool {
	if u.Known {
		m.usage = policy.Usage{Input: max(m.usage.Input, u.Input), Output: max(m.usage.Output, u.Output), Known: true}
	}
	return u.Known
}

// replyText is where each API's reply carries its text: a stream's
// deltas, a whole body's message.
var replyText = [...][]string{
	policy.APIChat: {"choices.0.delta.content", "choices.0.delta.reasoning_content",
		"choices.0.delta.tool_calls.0.function.arguments", "choices.0.message.content"},
	policy.APICompletions: {"choices.0.text"},
	policy.APIResponses:   {"delta"},
	policy.APIAnthropic:   {"delta.text", "delta.partial_json", "delta.thinking", "content.0.text"},
	policy.APIOllama:      {"message.content", "response"},
	policy.APIOther:       nil,
}

// cutOver: a continuation takes over from the attempt metered so far,
// whose output is what it told, or what it streamed ÷ 4.
func (m *meter) cutOver() {
	m.prior += max(m.usage.Output, textTokens(m.text))
	m.usage, m.text, m.pending, m.over, m.dropped = policy.Usage{}, 0, m.pending[:0], false, 0
}

// textTokens is a count of characters as tokens: ÷ 4, rounded up.
func textTokens(size int) int64 { return (int64(size) + 3) / 4 }

// result is the reply's usage as metered: what the last attempt told,
// with the output of those it took over from; streamed is the output
// when it told none (its characters ÷ 4, with the prior attempts').
func (m *meter) result() (u usage) {
	u.model = m.model
	u.Usage = m.usage
	u.Output += m.prior
	u.streamed = m.prior + textTokens(m.text)
	return u
}
