package main

import (
	"fmt"
	"strings"
)

// plainDefaults are defaults that are words, not values: written without
// backticks.
var plainDefaults = map[string]bool{"none": true, "off": true, "on": true, "any": true}

// section is one top-level key's part of the reference, or a run of
// top-level keys with no keys under them (run).
type section struct {
	title []string
	run   bool
	keys  []Key
}

// render is the generated region: one section per top-level key, each a
// table of its keys in field order.
func render(keys []Key) string {
	var secs []*section
	for _, k := range keys {
		top := topOf(k.Path)
		switch last := len(secs) - 1; {
		case k.Path != top: // under the last section's top-level key
		case k.Leaf && last >= 0 && secs[last].run:
			secs[last].title = append(secs[last].title, top)
		default:
			secs = append(secs, &section{title: []string{top}, run: k.Leaf})
		}
		secs[len(secs)-1].keys = append(secs[len(secs)-1].keys, k)
	}
	var b strings.Builder
	b.WriteString("\n<!-- Generated from the doc comments of the config types (tools/configref): edit those, not this. -->\n")
	for _, s := range secs {
		fmt.Fprintf(&b, "\n## %s\n\n| key | default | meaning |\n|---|---|---|\n", strings.Join(s.title, ", "))
		for _, k := range s.keys {
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", k.Path, cell(defaultCell(k.Doc)), cell(k.Doc.Text))
		}
	}
	b.WriteString("\n")
	return b.String()
}

// topOf is the top-level key a path starts with.
func topOf(path string) string {
	if i := strings.IndexAny(path, ".["); i >= 0 {
		return path[:i]
	}
	return path
}

// defaultCell is what the default column says: required, a value in
// backticks, or words as they are.
func defaultCell(d Doc) string {
	switch v := d.Default; {
	case d.Required:
		return "required"
	case v == "", strings.Contains(v, "`"), plainDefaults[v], strings.Contains(v, " "):
		return v
	default:
		return "`" + v + "`"
	}
}

// cell escapes s for a table cell: | everywhere, and outside code spans
// < (an HTML tag's start) and * (emphasis).
func cell(s string) string {
	var b strings.Builder
	code := false
	for _, r := range s {
		switch {
		case r == '`':
			code = !code
		case r == '|':
			b.WriteString(`\`)
		case code:
		case r == '<':
			b.WriteString("&lt;")
			continue
		case r == '*':
			b.WriteString(`\`)
		}
		b.WriteRune(r)
	}
	return b.String()
}
