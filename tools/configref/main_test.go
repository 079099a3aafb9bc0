package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// root is the module's root, from this package's directory.
const root = "../.."

// TestEveryKeyIsDocumented fails naming each key whose field has no doc
// comment, and each key written whole (no keys under it) whose comment
// gives neither a default ("Default X.") nor "Required.".
func TestEveryKeyIsDocumented(t *testing.T) {
	t.Parallel()
	keys, err := collect(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < 100 {
		t.Fatalf("only %d keys found: the walk lost its way", len(keys))
	}
	var undescribed, undefaulted []string
	for _, k := range keys {
		if k.Doc.Text == "" {
			undescribed = append(undescribed, k.Path)
		}
		if k.Leaf && k.Doc.Default == "" && !k.Doc.Required {
			undefaulted = append(undefaulted, k.Path)
		}
	}
	if len(undescribed) > 0 {
		t.Errorf("%d keys have no description (their field's doc comment):\n\t%s", len(undescribed), strings.Join(undescribed, "\n\t"))
	}
	if len(undefaulted) > 0 {
		t.Errorf("%d keys have neither \"Default X.\" nor \"Required.\" in their field's doc comment:\n\t%s",
			len(undefaulted), strings.Join(undefaulted, "\n\t"))
	}
}

// TestTheReferenceIsCurrent fails when docs/configuration.md's generated
// region is not what the config types' comments say now.
func TestTheReferenceIsCurrent(t *testing.T) {
	t.Parallel()
	want, err := generate(root)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, docPath))
	if err != nil {
		t.Fatalf("%v: run go run ./tools/configref -w", err)
	}
	start, end, err := region(doc)
	if err != nil {
		t.Fatalf("%s: %v: run go run ./tools/configref -w", docPath, err)
	}
	if got := string(doc[start:end]); got != want {
		t.Errorf("%s is stale (first difference at line %d): run go run ./tools/configref -w", docPath, firstDiff(got, want))
	}
}

// firstDiff is the first line (from 1) where a and b differ.
func firstDiff(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}

func TestParseDoc(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, field, text string
		want              Doc
	}{
		{"leading name and verb dropped", "Listen", "Listen is the client-facing\naddress. Default `:8080`.\n",
			Doc{Text: "The client-facing address.", Default: "`:8080`"}},
		{"leading name, capitalised", "ShutdownDelay", "ShutdownDelay keeps serving this long. Default 0s. Hot-reloads.",
			Doc{Text: "Keeps serving this long. Hot-reloads.", Default: "0s"}},
		{"name then a comma", "TLS", "TLS, when cert_file is set, serves HTTPS. Default off.",
			Doc{Text: "When cert_file is set, serves HTTPS.", Default: "off"}},
		{"a longer word starting with the name stays", "Max", "Maximum of things. Default 3.",
			Doc{Text: "Maximum of things.", Default: "3"}},
		{"Default: a phrase", "Burst", "Burst is how many at once. Default: the rate rounded up, at least 1.",
			Doc{Text: "How many at once.", Default: "the rate rounded up, at least 1"}},
		{"a decimal default", "Ratio", "Ratio is a share. Default 0.5.", Doc{Text: "A share.", Default: "0.5"}},
		{"periods inside parentheses and backticks", "On", "On lists reasons (see policy.ParseRetryOn). Default `[429, 5xx]`. Needs a restart.",
			Doc{Text: "Lists reasons (see policy.ParseRetryOn). Needs a restart.", Default: "`[429, 5xx]`"}},
		{"required", "Name", "Name identifies it. Required.", Doc{Text: "Identifies it.", Required: true}},
		{"no comment", "Name", "", Doc{}},
		{"a sentence merely naming Default stays", "X", "X is one. Defaults of others differ.",
			Doc{Text: "One. Defaults of others differ."}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := parseDoc(c.field, c.text); got != c.want {
				t.Errorf("parseDoc(%q, %q) = %+v, want %+v", c.field, c.text, got, c.want)
			}
		})
	}
}

func TestSplice(t *testing.T) {
	t.Parallel()
	doc := "# Title\n\nprose\n" + beginMarker + "\nold\n" + endMarker + "\nafter\n"
	got, err := splice([]byte(doc), "\nnew\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Title\n\nprose\n" + beginMarker + "\n\nnew\n" + endMarker + "\nafter\n"; string(got) != want {
		t.Errorf("splice = %q, want %q", got, want)
	}
	if got, _ := splice([]byte("# Title\n"), "x\n"); string(got) != "# Title\n\n"+beginMarker+"\nx\n"+endMarker+"\n" {
		t.Errorf("splice without markers = %q", got)
	}
	if _, err := splice([]byte(beginMarker+"\nno end\n"), "x\n"); err == nil {
		t.Error("splice of a region without its end: no error")
	}
}
