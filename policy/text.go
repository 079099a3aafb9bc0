package policy

import (
	"strings"

	"github.com/tidwall/gjson"
)

// MaxTextDepth bounds how deep TextBytes follows nested arrays and
// objects. A value nested deeper counts all its bytes as text: the
// estimate stays an upper bound and the walk linear, with a fixed stack.
const MaxTextDepth = 64

// TextBytes counts the bytes, in UTF-8, of the text in raw, one JSON
// value: a string's, an array's elements', an object's "text" and
// "content" values', at any depth up to MaxTextDepth. Bytes, not
// characters, because a token is about four bytes of any script: an
// English word's letters, a CJK character's three bytes.
//
// It reads raw once, left to right, in time linear in its length and
// without recursion; malformed JSON counts what it can and never fails.
func TextBytes(raw string) int {
	n, _ := textValue(raw, 0)
	return n
}

// textValue is TextBytes of the value that starts at raw[i] (or after
// the spaces there), and the index just past it.
func textValue(raw string, i int) (n, end int) {
	// frame is one open array or object: whether its values count, and
	// for an object whether a key comes next and whether the current
	// key's value counts ("text", "content").
	type frame struct{ obj, counts, key, val bool }
	var stack [MaxTextDepth]frame
	depth := 0
	// counting says the value starting at i counts.
	counting := func() bool {
		if depth == 0 {
			return true
		}
		f := &stack[depth-1]
		return f.counts && (!f.obj || f.val)
	}
	for i < len(raw) {
		switch c := raw[i]; c {
		case '"':
			end, size := stringEnd(raw, i)
			if depth > 0 && stack[depth-1].obj && stack[depth-1].key {
				f := &stack[depth-1]
				f.key, f.val = false, isTextKey(raw, i, end)
			} else if counting() {
				n += size
			}
			if i = end; depth == 0 {
				return n, i
			}
		case '[', '{':
			if depth == MaxTextDepth { // too deep to follow: its bytes count
				end := valueEnd(raw, i)
				n, i = n+(end-i)*b2i(counting()), end
				continue
			}
			stack[depth] = frame{obj: c == '{', counts: counting(), key: c == '{'}
			depth, i = depth+1, i+1
		case ']', '}':
			i++
			if depth > 0 {
				if depth--; depth == 0 {
					return n, i
				}
			}
		case ',':
			if depth > 0 && stack[depth-1].obj {
				stack[depth-1].key, stack[depth-1].val = true, false
			}
			i++
		case ' ', '\t', '\n', '\r', ':':
			i++
		default: // a number, true, false, null
			if depth == 0 {
				return n, valueEnd(raw, i)
			}
			i++
		}
	}
	return n, i
}

// b2i is 1 for true, 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// isTextKey reports whether the key raw[i:end] (a JSON string) names
// text: "text" or "content", read as a parser reads an escaped key.
func isTextKey(raw string, i, end int) bool {
	k := raw[i+1 : max(end-1, i+1)]
	if strings.IndexByte(k, '\\') >= 0 {
		k = gjson.Parse(raw[i:end]).Str
	}
	return k == "text" || k == "content"
}

// Fields calls f with each key of the JSON object raw and the index its
// value starts at; f returns the index just past the value (valueEnd,
// or its own reading of it). One pass over the keys, in order; malformed
// JSON ends it early, never in error. A key is as its bytes are
// (escapes unread).
func Fields(raw string, f func(key string, i int) int) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return
	}
	for i = skipSpace(raw, i+1); i < len(raw) && raw[i] == '"'; {
		end, _ := stringEnd(raw, i)
		key := raw[i+1 : max(end-1, i+1)]
		if i = skipSpace(raw, end); i >= len(raw) || raw[i] != ':' {
			return
		}
		if i = skipSpace(raw, i+1); i >= len(raw) {
			return
		}
		if i = skipSpace(raw, max(f(key, i), i+1)); i >= len(raw) || raw[i] != ',' {
			return
		}
		i = skipSpace(raw, i+1)
	}
}

// skipSpace returns the index of the first byte at or after i that is
// not JSON whitespace.
func skipSpace(raw string, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string that starts at
// raw[i] (a '"'), or len(raw) when it does not end, and its text's bytes
// in UTF-8: an escape counts what it stands for at most (\u, three). It
// finds quotes and backslashes with vectorized searches.
func stringEnd(raw string, i int) (end, size int) {
	for j := i + 1; j < len(raw); {
		rest := raw[j:]
		q := strings.IndexByte(rest, '"')
		if q < 0 {
			q = len(rest)
		}
		bs := strings.IndexByte(rest[:q], '\\')
		if bs < 0 {
			return min(j+q+1, len(raw)), size + q
		}
		size += bs // the text before it
		if bs+1 < len(rest) && rest[bs+1] == 'u' {
			j, size = j+bs+6, size+3
		} else {
			j, size = j+bs+2, size+1
		}
	}
	return len(raw), size
}

// valueEnd returns the index just past the JSON value that starts at
// raw[i], or len(raw) when it does not end: an array or object by its
// brackets, a string by its quote, anything else at the next delimiter.
func valueEnd(raw string, i int) int {
	switch raw[i] {
	case '"':
		end, _ := stringEnd(raw, i)
		return end
	case '[', '{':
	default:
		for i < len(raw) && raw[i] != ',' && raw[i] != '}' && raw[i] != ']' && raw[i] != ' ' && raw[i] != '\n' &&
			raw[i] != '\r' && raw[i] != '\t' {
			i++
		}
		return i
	}
	depth := 0
	for j := i; j < len(raw); {
		switch raw[j] {
		case '"':
			j, _ = stringEnd(raw, j)
			continue
		case '[', '{':
			depth++
		case ']', '}':
			if depth--; depth == 0 {
				return j + 1
			}
		}
		j++
	}
	return len(raw)
}
