package policy

import (
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// MaxTextDepth bounds how deep TextChars follows nested arrays and
// objects. A value nested deeper counts all its bytes as characters: the
// estimate stays an upper bound and the walk linear, with a fixed stack.
const MaxTextDepth = 64

// TextChars counts the characters of the text in raw, one JSON value: a
// string's, an array's elements', an object's "text" and "content"
// values', at any depth up to MaxTextDepth.
//
// It reads raw once, left to right, in time linear in its length and
// without recursion; malformed JSON counts what it can and never fails.
// An escape sequence counts as one character, as its text does.
func TextChars(raw string) int {
	// frame is one open array or object: whether its values count, and
	// for an object whether a key comes next and whether the current
	// key's value counts ("text", "content").
	type frame struct{ obj, counts, key, val bool }
	var stack [MaxTextDepth]frame
	depth, n := 0, 0
	// counting says the value starting at i counts.
	counting := func() bool {
		if depth == 0 {
			return true
		}
		f := &stack[depth-1]
		return f.counts && (!f.obj || f.val)
	}
	for i := 0; i < len(raw); {
		switch c := raw[i]; c {
		case '"':
			end, chars := stringEnd(raw, i)
			if depth > 0 && stack[depth-1].obj && stack[depth-1].key {
				f := &stack[depth-1]
				k := raw[i+1 : max(end-1, i+1)]
				if strings.IndexByte(k, '\\') >= 0 { // an escaped key: as a parser reads it
					k = gjson.Parse(raw[i:end]).Str
				}
				f.key, f.val = false, k == "text" || k == "content"
			} else if counting() {
				n += chars
			}
			i = end
		case '[', '{':
			if depth == MaxTextDepth {
				end := valueEnd(raw, i)
				if counting() {
					n += end - i
				}
				i = end
				continue
			}
			stack[depth] = frame{obj: c == '{', counts: counting(), key: c == '{'}
			depth++
			i++
		case ']', '}':
			if depth > 0 {
				depth--
			}
			i++
		case ',':
			if depth > 0 && stack[depth-1].obj {
				stack[depth-1].key, stack[depth-1].val = true, false
			}
			i++
		default: // whitespace, ':', a number, true, false, null
			i++
		}
	}
	return n
}

// stringEnd returns the index just past the JSON string that starts at
// raw[i] (a '"'), or len(raw) when it does not end, and its characters:
// a rune, an invalid byte and an escape sequence count one each.
func stringEnd(raw string, i int) (end, chars int) {
	for j := i + 1; j < len(raw); {
		switch c := raw[j]; {
		case c == '"':
			return j + 1, chars
		case c == '\\':
			if j+1 < len(raw) && raw[j+1] == 'u' {
				j += 6
			} else {
				j += 2
			}
			chars++
		case c < utf8.RuneSelf:
			chars++
			j++
		default: // a rune, or an invalid byte, counts one (as utf8.RuneCount does)
			_, size := utf8.DecodeRuneInString(raw[j:])
			chars++
			j += size
		}
	}
	return len(raw), chars
}

// valueEnd returns the index just past the array or object that starts
// at raw[i], or len(raw) when it does not end, counting brackets only.
func valueEnd(raw string, i int) int {
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
