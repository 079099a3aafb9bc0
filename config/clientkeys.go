package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"

	"sturdy/proxy"
)

// MaxClientKeysFileBytes bounds client_keys_file's size (16 MiB, room
// for proxy.MaxClientKeys keys with names), and auth.keys_file's.
const MaxClientKeysFileBytes = 16 << 20

// MaxSecretFileBytes bounds a file holding one secret: api_key_file,
// admin.token_file, shared_state.password_file.
const MaxSecretFileBytes = 64 << 10

// ClientKey is one client key's settings: its one shape is package
// proxy's ClientKey.
type ClientKey = proxy.ClientKey

// clientKeysDoc is client_keys_file's document.
type clientKeysDoc struct {
	Keys []ClientKey `yaml:"keys"`
}

// readClientKeys reads client_keys_file into c.ClientKeys; its problems
// name that file (and their key and line in it).
func (c *Config) readClientKeys(idx *keyIndex) []Problem {
	path := c.ClientKeysFile
	if path == "" {
		return nil
	}
	data, err := readBounded(path, MaxClientKeysFileBytes)
	if err != nil {
		return []Problem{{Key: "client_keys_file", Line: idx.line("client_keys_file"), Msg: err.Error()}}
	}
	keys, ps := ParseClientKeys(data)
	for i := range ps {
		ps[i].File = path
	}
	c.ClientKeys = keys
	return ps
}

// readBounded reads the regular file at path, refusing one over limit
// bytes. A FIFO, a device (/dev/zero) or a directory is refused before
// it is opened: reading one could hang or never end.
func readBounded(path string, limit int64) ([]byte, error) {
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("cannot read %q: %v", path, errors.Unwrap(err))
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%q is not a regular file but %s", path, fileKind(st.Mode()))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %q: %v", path, errors.Unwrap(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("cannot read %q: %v", path, err)
	case int64(len(data)) > limit:
		return nil, fmt.Errorf("%q is over %s", path, sizeText(limit))
	}
	return data, nil
}

// fileKind names what a file that is not regular is.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "not a plain file"
}

// sizeText says a limit as its unit does: 64 KiB, 16 MiB.
func sizeText(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// ParseClientKeys decodes and validates a client_keys_file document:
// each problem with its key and line, none quoting a key.
func ParseClientKeys(data []byte) ([]ClientKey, []Problem) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, syntaxProblems(err, data)
	}
	problems := dropDuplicateKeys(&root, "")
	problems = append(problems, moreDocuments(data)...)
	idx := newKeyIndex(&root)
	problems = append(problems, schemaProblems(&root, reflect.TypeFor[clientKeysDoc]())...)
	var doc clientKeysDoc
	if len(root.Content) > 0 {
		if err := root.Content[0].Decode(&doc); err != nil {
			problems = append(problems, yamlProblems(err, idx)...)
		}
	}
	bad := func(key, format string, args ...any) {
		problems = append(problems, Problem{Key: key, Line: idx.line(key), Msg: fmt.Sprintf(format, args...)})
	}
	if len(doc.Keys) > proxy.MaxClientKeys {
		bad("keys", "%d keys, more than %d", len(doc.Keys), proxy.MaxClientKeys)
		return nil, problems
	}
	seen := make(map[[sha256.Size]byte]int, len(doc.Keys))
	for i := range doc.Keys {
		validateClientKey(bad, fmt.Sprintf("keys[%d]", i), &doc.Keys[i], i, seen)
	}
	return doc.Keys, problems
}

// validateClientKey checks keys[i] (k: its path), expanding its key's
// ${VAR}; seen holds the keys so far by hash, for duplicates.
func validateClientKey(bad func(key, format string, args ...any), k string, ck *ClientKey, i int, seen map[[sha256.Size]byte]int) {
	var sum [sha256.Size]byte
	switch {
	case (ck.Key == "") == (ck.SHA256 == ""):
		bad(k, "set sha256 (the key's SHA-256, in hex) or key (as ${VAR}), one of the two")
		return
	case ck.Key != "":
		m := envRef.FindStringSubmatch(ck.Key)
		if m == nil || m[0] != ck.Key {
			bad(k+".key", "write the key as ${VAR} (the environment holds it), or give its sha256: a key is never written in the file")
			return
		}
		if ck.Key = os.Getenv(m[1]); ck.Key == "" {
			bad(k+".key", "the variable %s is unset or empty", m[1])
			return
		}
		sum = sha256.Sum256([]byte(ck.Key))
	default:
		if len(ck.SHA256) != 2*sha256.Size || hexInvalid(sum[:], ck.SHA256) {
			bad(k+".sha256", "must be 64 hex digits (a SHA-256: printf %%s \"$KEY\" | sha256sum)")
			return
		}
		ck.SHA256 = strings.ToLower(ck.SHA256)
	}
	if j, dup := seen[sum]; dup {
		bad(k, "the same key as keys[%d]", j)
	}
	seen[sum] = i
	if ck.RequestsPerSecond < 0 {
		bad(k+".requests_per_second", "must not be negative (0: the clients: entries' limit)")
	}
	validateTokenLimits(bad, k+".", ck.TokenLimits)
	validateSpend(bad, k+".", ck.Spend, true) // that prices: is set is the config's to check (validatePrices)
	switch {
	case ck.Burst < 0:
		bad(k+".burst", "must not be negative")
	case ck.Burst > 0 && ck.RequestsPerSecond == 0:
		bad(k+".burst", "is a burst of requests_per_second: set that too")
	}
}

// hexInvalid decodes s into dst (of len(s)/2 bytes), reporting whether s
// is not hex.
func hexInvalid(dst []byte, s string) bool {
	_, err := hex.Decode(dst, []byte(s))
	return err != nil
}
