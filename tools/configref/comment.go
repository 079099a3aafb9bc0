package main

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Doc is what a field's doc comment says about its key. The convention:
// the comment describes the key in Go doc style (its leading field name,
// and an "is" or "are" after it, are dropped), a sentence "Default X."
// gives the default (X as written in YAML, or in backticks; "Default: X."
// for words), "Required." marks a key that must be written, and "Needs a
// restart." marks one a reload does not apply (kept in the text).
type Doc struct {
	// Text is the description on one line, without the comment's leading
	// field name and without its Default and Required sentences.
	Text string
	// Default is the Default sentence's X ("" when there is none).
	Default string
	// Required says the comment has the sentence "Required.".
	Required bool
}

// parseDoc reads the doc comment text of the Go field named field.
func parseDoc(field, text string) Doc {
	text = strings.Join(strings.Fields(text), " ")
	text = stripName(field, text)
	var d Doc
	var kept []string
	for _, s := range sentences(text) {
		switch {
		case s == "Required.":
			d.Required = true
		case strings.HasPrefix(s, "Default: "), strings.HasPrefix(s, "Default ") && len(s) > len("Default ."):
			v := strings.TrimPrefix(strings.TrimPrefix(s, "Default"), ":")
			d.Default = strings.TrimSpace(strings.TrimSuffix(v, "."))
		default:
			kept = append(kept, s)
		}
	}
	d.Text = strings.Join(kept, " ")
	return d
}

// stripName drops Go doc style's leading field name from text ("Listen
// is the address." → "The address."; "TLS, when set, serves" → "When
// set, serves"), and capitalises what is left.
func stripName(field, text string) string {
	rest, ok := strings.CutPrefix(text, field)
	if !ok || rest != "" && rest[0] != ' ' && rest[0] != ',' {
		return text
	}
	rest = strings.TrimLeft(rest, " ,")
	for _, verb := range []string{"is ", "are "} {
		if r, ok := strings.CutPrefix(rest, verb); ok {
			rest = r
			break
		}
	}
	r, n := utf8.DecodeRuneInString(rest)
	if unicode.IsLower(r) {
		rest = string(unicode.ToUpper(r)) + rest[n:]
	}
	return rest
}

// sentences splits text after each period followed by a space or the
// end, unless the period is inside parentheses, backticks or quotes.
func sentences(text string) []string {
	var out []string
	depth, code, quote, start := 0, false, false, 0
	for i := 0; i < len(text); i++ {
		switch c := text[i]; {
		case c == '`':
			code = !code
		case code:
		case c == '"':
			quote = !quote
		case quote:
		case c == '(':
			depth++
		case c == ')' && depth > 0:
			depth--
		case c == '.' && depth == 0 && (i+1 == len(text) || text[i+1] == ' '):
			out = append(out, strings.TrimSpace(text[start:i+1]))
			start = i + 1
		}
	}
	if s := strings.TrimSpace(text[start:]); s != "" {
		out = append(out, s)
	}
	return out
}
