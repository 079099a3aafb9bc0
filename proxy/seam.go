package proxy

import (
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/sjson"

	"sturdy/policy"
)

// messageSeam joins a Messages API stream and its continuations into the
// one stream the client sees: a continuation's message_start is dropped
// (the client has its own, its id with it), its first text block is
// joined to the cut one when that block is an open text block (its start
// dropped, its indexes mapped onto the cut block's) or else follows the
// client's blocks (the cut block stopped first), the whitespace the
// prefill stripped is not sent twice, and the final message_delta's
// output_tokens counts every attempt's output.
type messageSeam struct {
	// block is the index of the client's last content block (-1: none),
	// open that it has had no stop, text that it is a text block.
	block      int64
	open, text bool
	// shift maps the relayed stream's block indexes onto the client's;
	// mapped says a continuation's first block (or its end) was seen.
	shift  int64
	mapped bool
	// ws is how much of the continuation's leading whitespace is dropped
	// at the seam: what the prefill's end stripped (prefillMessages).
	ws int
	// prior is the output tokens of the attempts cut before the relayed
	// one; tokens what the relayed one last reported, streamed the bytes
	// of text it streamed (an estimate, ÷ 4, where it reported less).
	prior, tokens int64
	streamed      int
}

// cutOver prepares the seam for a continuation taking over: the cut
// attempt's output counted, ws the whitespace its prefill stripped.
func (m *messageSeam) cutOver(ws int) {
	m.prior += max(m.tokens, textTokens(m.streamed))
	m.tokens, m.streamed, m.mapped, m.shift, m.ws = 0, 0, false, 0, ws
}

// relay appends to dst what the client gets of one event (raw, read as
// ev) of the relayed stream, a continuation's when cont, and returns the
// text the client got of it. An event goes as it came unless the seam
// changes it (its index, its text's leading whitespace, the final count).
func (m *messageSeam) relay(dst []byte, ev policy.MessageEvent, raw, data []byte, cont bool) ([]byte, string) {
	if ev.OutputTokens >= 0 {
		m.tokens = ev.OutputTokens
	}
	if !cont {
		m.track(ev, ev.Index)
		m.streamed += len(ev.Text)
		return append(dst, raw...), ev.Text
	}
	idx := ev.Index + m.shift
	switch ev.Type {
	case "message_start":
		return dst, ""
	case "content_block_start":
		if !m.mapped {
			m.mapped = true
			if ev.Block == "text" && ev.Index == 0 && m.open && m.text { // joined: the client's block goes on
				m.shift = m.block
				return m.joined(dst, ev.Text)
			}
			dst = m.stopOpen(dst)
			m.shift = m.block + 1 - ev.Index
			idx = m.block + 1
		}
		m.track(ev, idx)
		return m.edit(dst, ev, raw, data, idx, "content_block.text")
	case "content_block_delta":
		return m.edit(dst, ev, raw, data, idx, "delta.text")
	case "content_block_stop":
		m.track(ev, idx)
	case "message_delta", "message_stop":
		if !m.mapped { // a continuation that added nothing: the cut block ends here
			m.mapped = true
			dst = m.stopOpen(dst)
		}
		if ev.OutputTokens >= 0 && m.prior > 0 {
			data, _ = sjson.SetBytes(slices.Clone(data), "usage.output_tokens", ev.OutputTokens+m.prior)
			return messageEvent(dst, ev.Type, data), ""
		}
		return append(dst, raw...), ""
	}
	if m.shift == 0 || ev.Index < 0 {
		return append(dst, raw...), ""
	}
	data, _ = sjson.SetBytes(slices.Clone(data), "index", idx)
	return messageEvent(dst, ev.Type, data), ""
}

// edit relays a continuation's block event whose text (at path in data,
// if any) may lose leading whitespace at the seam, at the client's index
// idx: as it came when neither changes, else rewritten; a delta left
// with no text is dropped.
func (m *messageSeam) edit(dst []byte, ev policy.MessageEvent, raw, data []byte, idx int64, path string) ([]byte, string) {
	text := m.trimmed(ev.Text)
	m.streamed += len(text)
	switch {
	case text == "" && ev.Text != "" && ev.Type == "content_block_delta":
		return dst, ""
	case text == ev.Text && idx == ev.Index:
		return append(dst, raw...), text
	}
	data, _ = sjson.SetBytes(slices.Clone(data), "index", idx)
	if text != ev.Text {
		data, _ = sjson.SetBytes(data, path, text)
	}
	return messageEvent(dst, ev.Type, data), text
}

// joined appends a joined block start's own text as a text_delta of the
// client's block, less the seam's whitespace (nothing when none is left).
func (m *messageSeam) joined(dst []byte, text string) ([]byte, string) {
	text = m.trimmed(text)
	m.streamed += len(text)
	if text == "" {
		return dst, ""
	}
	data := fmt.Appendf(nil, `{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":""}}`, m.block)
	data, _ = sjson.SetBytes(data, "delta.text", text)
	return messageEvent(dst, "content_block_delta", data), text
}

// trimmed is a continuation's text less the leading whitespace the seam
// still drops (ws bytes); its first other character ends the dropping.
func (m *messageSeam) trimmed(text string) string {
	i := 0
	for i < len(text) && m.ws > 0 {
		r, n := utf8.DecodeRuneInString(text[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i, m.ws = i+n, m.ws-n
	}
	if i < len(text) {
		m.ws = 0
	}
	return text[i:]
}

// track follows the client's content blocks: ev, at the client's index
// idx, starts or stops one.
func (m *messageSeam) track(ev policy.MessageEvent, idx int64) {
	switch ev.Type {
	case "content_block_start":
		m.block, m.open, m.text = idx, true, ev.Block == "text"
	case "content_block_stop":
		m.open = false
	}
}

// stopOpen ends the client's open block, if one is, before what follows
// the seam goes in blocks of its own.
func (m *messageSeam) stopOpen(dst []byte) []byte {
	if !m.open {
		return dst
	}
	m.open = false
	return messageEvent(dst, "content_block_stop", fmt.Appendf(nil, `{"type":"content_block_stop","index":%d}`, m.block))
}

// messageEvent appends a Messages API event named typ with data.
func messageEvent(dst []byte, typ string, data []byte) []byte {
	dst = append(append(append(dst, "event: "...), typ...), "\ndata: "...)
	return append(append(dst, data...), "\n\n"...)
}
