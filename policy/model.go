package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"unicode/utf8"
)

// MaxModelBytes bounds a model name as Sturdy keeps and shows it.
const MaxModelBytes = 256

// modelHashDigits is how much of a long model's SHA-256 its key keeps,
// in hex digits.
const modelHashDigits = 16

// RuneCut returns the length of s's longest prefix of at most n bytes that
// ends where a character starts (a cut never splits one).
func RuneCut[T ~string | ~[]byte](s T, n int) int {
	if len(s) <= n {
		return len(s)
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}

// ModelKey returns a model name as Sturdy keeps it — the key of its reply
// breakers and cooldowns — and shows it, in /debug/upstreams, logs, metric
// labels, error messages and spans: the name itself up to MaxModelBytes;
// a longer one is its first bytes (cut where a character starts), "…"
// and the first 16 hex digits of its SHA-256, MaxModelBytes in all. The
// model comes from a client's body, so no value it sends makes Sturdy
// keep more than MaxModelBytes per key, and two long names that share a
// prefix stay apart. The short case costs nothing: the name is returned
// as it is.
func ModelKey(model string) string {
	if len(model) <= MaxModelBytes {
		return model
	}
	sum := sha256.Sum256([]byte(model))
	b := make([]byte, 0, MaxModelBytes)
	b = append(b, model[:RuneCut(model, MaxModelBytes-len("…")-modelHashDigits)]...)
	b = append(b, "…"...)
	b = hex.AppendEncode(b, sum[:modelHashDigits/2])
	return string(b)
}
