package main

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryPackageDocMapsItsFiles keeps each package's doc comment its
// map: every non-test file of a package of more than one is named there,
// so a file added without its line fails here.
func TestEveryPackageDocMapsItsFiles(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-json=ImportPath,Dir,GoFiles", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath string
			Dir        string
			GoFiles    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if len(p.GoFiles) < 2 {
			continue
		}
		doc := ""
		for _, f := range p.GoFiles {
			pf, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				t.Fatal(err)
			}
			if pf.Doc != nil {
				doc += pf.Doc.Text()
			}
		}
		if doc == "" {
			t.Errorf("%s has no package doc comment", p.ImportPath)
			continue
		}
		for _, f := range p.GoFiles {
			if f != "doc.go" && !strings.Contains(doc, f) { // doc.go holds the map
				t.Errorf("%s: the package doc does not name %s", p.ImportPath, f)
			}
		}
	}
}
