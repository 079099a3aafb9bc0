package units

import (
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestSizes(t *testing.T) {
	t.Parallel()
	tests := map[string]Size{"0": 0, "1024": 1024, "1KB": 1000, "1KiB": 1024, "32MiB": 32 << 20, "2MB": 2e6, "1 GiB": 1 << 30, "10B": 10}
	for in, want := range tests {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "1TB", "MiB", "1.5MiB", "x"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

// TestDecoding: each unit decodes what it documents and refuses the rest
// with a message naming the value.
func TestDecoding(t *testing.T) {
	t.Parallel()
	var v struct {
		D Duration `yaml:"d"`
		P Percent  `yaml:"p"`
		S Size     `yaml:"s"`
	}
	if err := yaml.Unmarshal([]byte("{d: 1m30s, p: 50%, s: 2MiB}"), &v); err != nil || v.D != Duration(90*time.Second) || v.P != 0.5 || v.S != 2<<20 {
		t.Fatalf("%+v, %v", v, err)
	}
	for doc, want := range map[string]string{"{d: 30}": `invalid duration "30"`, "{d: -1s}": "must not be negative",
		"{p: lots}": `invalid share "lots"`, "{s: 1TB}": `invalid size "1TB"`} {
		if err := yaml.Unmarshal([]byte(doc), &v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", doc, err, want)
		}
	}
	names := map[string]int{"a": 1, "b": 2}
	for doc, want := range map[string]string{"b": "", "c": `must be a or b (got "c")`, "[a]": "must be a or b (got a list)"} {
		var n yaml.Node
		_ = yaml.Unmarshal([]byte(doc), &n)
		got, err := Enum(n.Content[0], names, "a or b")
		if (want == "" && (err != nil || got != 2)) || (want != "" && (err == nil || !strings.Contains(err.Error(), want))) {
			t.Errorf("%s: %v, %v", doc, got, err)
		}
	}
}
