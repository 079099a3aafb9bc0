package policy

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// Usage is what a reply says it used, in tokens; Known says it said.
type Usage struct {
	Input, Output int64
	Known         bool
}

// ReadUsage reads the usage a reply body tells, or a stream's events,
// by its API's rules (UsageReader): each object's usage is read from its
// place in the object, never from a key a client can echo (a Responses
// metadata "usage" is not the usage).
func ReadUsage(api API, b []byte) Usage {
	var r UsageReader
	r.Start(api)
	r.Feed(b)
	return r.Usage()
}

// usagePaths are where each API's objects carry their usage: the usage
// object's path (Ollama: its two counts' keys, top level).
var usagePaths = [...][][2]string{
	APIOther:       {{"usage"}},
	APIChat:        {{"usage"}},
	APICompletions: {{"usage"}},
	APIResponses:   {{"usage"}, {"response", "usage"}},
	APIAnthropic:   {{"usage"}, {"message", "usage"}},
	APIOllama:      {{"prompt_eval_count"}, {"eval_count"}},
}

// maxUsageBytes bounds a usage value UsageReader keeps: Sturdy's own
// replies' are under 1 KiB.
const maxUsageBytes = 4 << 10

// maxUsageDepth bounds the nesting UsageReader follows: usage is at
// depth 1 or 2; deeper structure is only counted.
const maxUsageDepth = 63

// maxUsageKey is the longest key a usage path holds
// ("prompt_eval_count"): a longer key names none.
const maxUsageKey = 17

// UsageReader reads a reply's usage as its bytes go by, in pieces of any
// size, keeping a few bytes of state and the usage values it meets
// (at most maxUsageBytes each): the JSON objects fed one after another
// (a body, or a stream's events with their framing, which it skips), and
// each object's usage read from its place (usagePaths), by the API's
// rules:
//   - chat, completions, embeddings: usage's prompt_tokens and
//     completion_tokens (an embedding's output is 0; input_tokens and
//     output_tokens where a server names them so);
//   - Responses: usage's input_tokens and output_tokens, a stream's in
//     its response (response.completed);
//   - Anthropic: the input is input_tokens + cache_creation_input_tokens
//   - cache_read_input_tokens (a stream's in message_start's message),
//     the output output_tokens (message_delta's is cumulative);
//   - Ollama: prompt_eval_count and eval_count (a cached prompt has no
//     prompt_eval_count: 0).
//
// A later object's counts replace an earlier's, each count it tells.
type UsageReader struct {
	api   API
	usage Usage
	// depth is how deep the reader is (0: between objects); objects and
	// keyNext have bit d set when depth d is an object, and when a key
	// comes next there.
	depth            int
	objects, keyNext uint64
	// keys are the member keys open at depths 1 and 2 (keyLen -1: longer
	// than any usage path's); key is the key being read.
	keys                     [2][maxUsageKey]byte
	keyLen                   [2]int
	key                      [maxUsageKey]byte
	kn                       int
	inString, escaped, inKey bool
	// capture is the usage value being read (of path target, begun at
	// depth capDepth; a string, number or literal when capScalar).
	capture              []byte
	capturing, capScalar bool
	capDepth, target     int
	values               [2][]byte // the object's usage values, by path
	found                [2]bool
}

// Start readies r for a reply of api.
func (r *UsageReader) Start(api API) {
	capture, v0, v1 := r.capture[:0], r.values[0][:0], r.values[1][:0]
	*r = UsageReader{api: api, capture: capture, values: [2][]byte{v0, v1}}
}

// Usage is what the objects fed so far told.
func (r *UsageReader) Usage() Usage { return r.usage }

// Feed reads the next bytes of the reply.
func (r *UsageReader) Feed(b []byte) {
	for _, c := range b {
		if r.capturing {
			if r.capScalar && !r.inString && (c == ',' || c == '}' || c == ']' || isSpace(c)) {
				r.endCapture()
			} else if len(r.capture) < maxUsageBytes {
				r.capture = append(r.capture, c)
			} else {
				r.capturing = false // too long to be a usage
			}
		}
		switch {
		case r.inString:
			r.inStringByte(c)
		case r.depth == 0:
			if c == '{' { // an object begins; what came before it (SSE framing) is skipped
				r.open(true)
				r.found = [2]bool{}
			}
		case c == '"':
			r.inString = true
			if r.keyNext&(1<<r.depth) != 0 {
				r.inKey, r.kn = true, 0
			} else {
				r.valueStarts(true)
			}
		case c == '{' || c == '[':
			r.valueStarts(false)
			r.open(c == '{')
		case c == '}' || c == ']':
			r.depth--
			if r.capturing && !r.capScalar && r.depth == r.capDepth {
				r.endCapture()
			}
			if r.depth == 0 {
				r.endObject()
			}
		case c == ',':
			if r.depth <= maxUsageDepth && r.objects&(1<<r.depth) != 0 {
				r.keyNext |= 1 << r.depth
			}
		case c == ':' || isSpace(c):
		default: // a number, true, false, null begins (or goes on)
			if !r.capturing {
				r.valueStarts(true)
				if r.capturing {
					r.capture = append(r.capture, c)
				}
			}
		}
	}
}

// inStringByte reads byte c of a string: a key's, a value's.
func (r *UsageReader) inStringByte(c byte) {
	switch {
	case r.escaped:
		r.escaped = false
	case c == '\\':
		r.escaped = true
		r.kn = maxUsageKey + 1 // an escaped key names no usage path
	case c == '"':
		r.inString = false
		if r.inKey {
			r.endKey()
		} else if r.capturing && r.capScalar {
			r.endCapture()
		}
	case r.inKey:
		if r.kn < maxUsageKey {
			r.key[r.kn] = c
		}
		r.kn++
	}
}

// open enters an array or object (obj) one level deeper.
func (r *UsageReader) open(obj bool) {
	r.depth++
	if r.depth > maxUsageDepth {
		return
	}
	bit := uint64(1) << r.depth
	r.objects, r.keyNext = r.objects&^bit, r.keyNext&^bit
	if obj {
		r.objects, r.keyNext = r.objects|bit, r.keyNext|bit
	}
}

// endKey ends a member key at the current depth: it names the path.
func (r *UsageReader) endKey() {
	r.inKey = false
	if r.depth > maxUsageDepth {
		return
	}
	r.keyNext &^= 1 << r.depth
	if d := r.depth; d == 1 || d == 2 {
		r.keys[d-1], r.keyLen[d-1] = r.key, r.kn
		if r.kn > maxUsageKey {
			r.keyLen[d-1] = -1
		}
	}
}

// valueStarts notes a value beginning at the current depth: one at a
// usage path starts a capture (scalar: a string, number or literal).
func (r *UsageReader) valueStarts(scalar bool) {
	if r.capturing || r.depth > 2 {
		return
	}
	for t, path := range usagePaths[r.api] {
		if r.at(path) {
			r.capturing, r.capDepth, r.target, r.capScalar, r.capture = true, r.depth, t, scalar, r.capture[:0]
			if !scalar {
				r.capture = append(r.capture, '{')
			}
			return
		}
	}
}

// at reports whether the value starting at the current depth is at path.
func (r *UsageReader) at(path [2]string) bool {
	switch r.depth {
	case 1:
		return path[1] == "" && r.keyIs(0, path[0])
	case 2:
		return path[1] != "" && r.keyIs(0, path[0]) && r.keyIs(1, path[1])
	}
	return false
}

// keyIs reports whether the key open at depth d+1 is k.
func (r *UsageReader) keyIs(d int, k string) bool {
	return r.keyLen[d] == len(k) && string(r.keys[d][:r.keyLen[d]]) == k
}

// endCapture keeps the value read as its object's usage value.
func (r *UsageReader) endCapture() {
	r.capturing = false
	if !r.found[r.target] {
		r.values[r.target], r.found[r.target] = append(r.values[r.target][:0], r.capture...), true
	}
}

// endObject reads the usage an object just ended told.
func (r *UsageReader) endObject() {
	if r.capturing && r.capScalar {
		r.endCapture()
	}
	r.capturing = false
	for t, v := range r.values {
		if !r.found[t] {
			continue
		}
		u := gjson.ParseBytes(v)
		if r.api != APIOllama {
			r.tell(u)
			continue
		}
		if u.Type == gjson.Number {
			if t == 0 {
				r.usage.Input = u.Int()
			} else {
				r.usage.Output = u.Int()
			}
			r.usage.Known = true
		}
	}
}

// isSpace reports whether c is JSON whitespace.
func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

// tell takes the counts of one usage object u.
func (r *UsageReader) tell(u gjson.Result) {
	if !u.IsObject() {
		return
	}
	inKey, outKey := "prompt_tokens", "completion_tokens"
	if r.api == APIResponses || r.api == APIAnthropic || !u.Get(inKey).Exists() && !u.Get(outKey).Exists() {
		inKey, outKey = "input_tokens", "output_tokens"
	}
	in, out := u.Get(inKey), u.Get(outKey)
	if !in.Exists() && !out.Exists() {
		return
	}
	r.usage.Known = true
	if in.Type == gjson.Number {
		r.usage.Input = in.Int()
		if r.api == APIAnthropic {
			r.usage.Input += u.Get("cache_creation_input_tokens").Int() + u.Get("cache_read_input_tokens").Int()
		}
	}
	if out.Type == gjson.Number {
		r.usage.Output = out.Int()
	}
}

// UsageChunk reports whether a chat or legacy completions stream's chunk
// is the one stream_options.include_usage adds: a usage, no choices.
func UsageChunk(data []byte) bool {
	if !bytes.Contains(data, []byte(`"usage":`)) {
		return false
	}
	c := gjson.GetBytes(data, "choices")
	return gjson.GetBytes(data, "usage").IsObject() && (!c.Exists() || c.IsArray() && c.Get("#").Int() == 0)
}

// AsksUsage reports whether a chat or legacy completions request body
// asks for a stream with its usage (stream_options.include_usage), and
// whether it asks for a stream at all.
func AsksUsage(body []byte) (stream, usage bool) {
	r := gjson.GetManyBytes(body, "stream", "stream_options.include_usage")
	return r[0].Bool(), r[1].Bool()
}
