// Command configref generates the configuration reference,
// docs/configuration.md, from the config types: every YAML key reachable
// from config.Config, with its default and meaning taken from its field's
// doc comment, so the types are the one source of truth.
//
//	go run ./tools/configref          # print the generated section
//	go run ./tools/configref -w       # rewrite it in docs/configuration.md
//
// The comment convention it reads is Doc's (comment.go). Its files:
//
//   - main.go: the command: flags, and splicing the section between the file's markers, nothing else.
//   - keys.go: which keys exist and their paths: config.Config by reflection, each struct's source parsed.
//   - comment.go: what a field's doc comment says: description, Default sentence, Required.
//   - render.go: the Markdown: one section per top-level key, one table row per key, in field order.
//   - main_test.go: every key described and defaulted (or required), the file current, comments parsed.
//
// Its tests fail when a key has no description, or neither a default nor
// Required, and when docs/configuration.md is stale.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The lines that fence the generated region of docs/configuration.md.
const (
	beginMarker = "<!-- BEGIN GENERATED: go run ./tools/configref -w -->"
	endMarker   = "<!-- END GENERATED -->"
)

// docPath is the reference's path under the module root.
var docPath = filepath.Join("docs", "configuration.md")

func main() {
	root := flag.String("root", ".", "the module's root directory")
	write := flag.Bool("w", false, "rewrite the generated region of docs/configuration.md in place")
	flag.Parse()
	if err := run(*root, *write); err != nil {
		fmt.Fprintln(os.Stderr, "configref:", err)
		os.Exit(1)
	}
}

// run generates the section and prints it, or writes it into the file.
func run(root string, write bool) error {
	section, err := generate(root)
	if err != nil {
		return err
	}
	if !write {
		_, err = os.Stdout.WriteString(section)
		return err
	}
	path := filepath.Join(root, docPath)
	old, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		old, err = []byte("# Configuration reference\n\n"+beginMarker+"\n"+endMarker+"\n"), nil
	}
	if err != nil {
		return err
	}
	updated, err := splice(old, section)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if bytes.Equal(updated, old) {
		return nil
	}
	return os.WriteFile(path, updated, 0o644)
}

// generate is the section for the module at root.
func generate(root string) (string, error) {
	keys, err := collect(root)
	if err != nil {
		return "", err
	}
	return render(keys), nil
}

// region returns where the lines between doc's marker lines start and
// end.
func region(doc []byte) (start, end int, err error) {
	b := bytes.Index(doc, []byte(beginMarker+"\n"))
	if b < 0 {
		return 0, 0, fmt.Errorf("no line %q", beginMarker)
	}
	start = b + len(beginMarker) + 1
	e := bytes.Index(doc[start-1:], []byte("\n"+endMarker))
	if e < 0 {
		return 0, 0, fmt.Errorf("no line %q after %q", endMarker, beginMarker)
	}
	return start, start + e, nil
}

// splice puts section between the markers of doc; a doc without them
// gets them appended, with section between.
func splice(doc []byte, section string) ([]byte, error) {
	if !bytes.Contains(doc, []byte(beginMarker)) && !bytes.Contains(doc, []byte(endMarker)) {
		out := bytes.TrimRight(doc, "\n")
		if len(out) > 0 {
			out = append(out, "\n\n"...)
		}
		return append(out, beginMarker+"\n"+section+endMarker+"\n"...), nil
	}
	start, end, err := region(doc)
	if err != nil {
		return nil, err
	}
	out := append([]byte{}, doc[:start]...)
	out = append(out, section...)
	return append(out, doc[end:]...), nil
}
