package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sturdy/upstream"
)

func TestClientKeysFileProblemsNameKeyAndLine(t *testing.T) {
	t.Parallel()
	const h = "3fc923743166bae134970eb2789df5145d8b8041e050acf18067986818f41d13"
	for _, tt := range []struct {
		name, doc, want string
	}{
		{"neither", "keys:\n  - {name: a}\n", "2: keys[0]: set sha256"},
		{"both", "keys:\n  - {sha256: " + h + ", key: \"${X}\"}\n", "2: keys[0]: set sha256"},
		{"a literal key", "keys:\n  - key: sk-live-123\n", "2: keys[0].key: write the key as ${VAR}"},
		{"an unset variable", "keys:\n  - key: ${STURDY_TEST_UNSET_KEY}\n", "2: keys[0].key: the variable STURDY_TEST_UNSET_KEY is unset"},
		{"not hex", "keys:\n  - {sha256: zz}\n", "2: keys[0].sha256: must be 64 hex digits"},
		{"too long", "keys:\n  - {sha256: " + h + h + "}\n", "2: keys[0].sha256: must be 64 hex digits"},
		{"a duplicate", "keys:\n  - {sha256: " + h + "}\n  - {sha256: " + strings.ToUpper(h) + "}\n", "3: keys[1]: the same key as keys[0]"},
		{"a bad class", "keys:\n  - {sha256: " + h + ", priority: urgent}\n", "2: keys[0].priority"},
		{"a negative rate", "keys:\n  - {sha256: " + h + ", requests_per_second: -1}\n", "2: keys[0].requests_per_second: must not be negative"},
		{"a burst alone", "keys:\n  - {sha256: " + h + ", burst: 5}\n", "2: keys[0].burst: is a burst of requests_per_second"},
		{"an unknown key", "keys:\n  - {sha256: " + h + ", tokens: 5}\n", "2: keys[0].tokens: unknown key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, ps := ParseClientKeys([]byte(tt.doc))
			err := (&Error{File: "keys.yaml", Problems: ps}).Error()
			if len(ps) == 0 || !strings.Contains(err, "keys.yaml:"+tt.want) {
				t.Fatalf("problems %q, want one with %q", err, tt.want)
			}
			if strings.Contains(err, "sk-live-123") {
				t.Fatalf("a key is quoted: %s", err)
			}
		})
	}
}

func TestAConfigReadsItsClientKeysFile(t *testing.T) {
	t.Setenv("STURDY_TEST_KEY", "sk-from-env")
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.yaml")
	if err := os.WriteFile(keys, []byte("keys:\n  - {key: \"${STURDY_TEST_KEY}\", name: env, priority: batch, requests_per_second: 2}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse("sturdy.yaml", []byte("client_keys_file: "+keys+"\nupstreams: [{name: a, url: http://127.0.0.1:1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.ClientKeys) != 1 || c.ClientKeys[0].Key != "sk-from-env" || *c.ClientKeys[0].Priority != upstream.PriorityBatch {
		t.Fatalf("keys %+v", c.ClientKeys)
	}
	if err := os.WriteFile(keys, []byte("keys:\n  - {sha256: x}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Parse("sturdy.yaml", []byte("client_keys_file: "+keys+"\nupstreams: [{name: a, url: http://127.0.0.1:1}]\n"))
	if err == nil || !strings.Contains(err.Error(), keys+":2: keys[0].sha256") {
		t.Fatalf("%v: want the keys file's own name and line", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxClientKeysFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Parse("sturdy.yaml", []byte("client_keys_file: "+big+"\nupstreams: [{name: a, url: http://127.0.0.1:1}]\n"))
	if err == nil || !strings.Contains(err.Error(), "sturdy.yaml:1: client_keys_file:") || !strings.Contains(err.Error(), "over 16 MiB") {
		t.Fatalf("%v: want the size refused at client_keys_file", err)
	}
}
