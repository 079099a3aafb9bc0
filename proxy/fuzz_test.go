package proxy

import (
	"bytes"
	"testing"
)

// FuzzBothFramings checks the smuggling guard against arbitrary header
// blocks: it agrees with a plain lower-cased search.
func FuzzBothFramings(f *testing.F) {
	for _, s := range []string{"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "content-length:1\ntransfer-encoding:x\n",
		"Host: x\r\n", "Content-Length 5\r\n", ":\n:\n", "TRANSFER-ENCODING : chunked\r\nCONTENT-LENGTH: 1\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		has := func(name string) bool {
			for _, line := range bytes.Split(raw, []byte("\n")) {
				if k, _, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(bytes.TrimSpace(k), []byte(name)) {
					return true
				}
			}
			return false
		}
		if got, want := bothFramings(raw), has("content-length") && has("transfer-encoding"); got != want {
			t.Fatalf("bothFramings(%q) = %v, want %v", raw, got, want)
		}
	})
}

// FuzzKindOf checks stream-kind detection never panics and is
// case-insensitive on the media type.
func FuzzKindOf(f *testing.F) {
	for _, s := range []string{"text/event-stream", "text/event-stream; charset=utf-8", "application/x-ndjson", "application/json", "", ";;"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, ct []byte) {
		if kindOf(ct) != kindOf(bytes.ToUpper(ct)) {
			t.Fatalf("kindOf(%q) depends on case", ct)
		}
	})
}
