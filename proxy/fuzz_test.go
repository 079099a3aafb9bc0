package proxy

import (
	"bufio"
	"bytes"
	"net/textproto"
	"testing"
)

// FuzzBothFramings checks the smuggling guard against an independent
// parser: whenever Go's textproto reads a header block as carrying both
// Content-Length and Transfer-Encoding, bothFramings must say so. (The
// guard may refuse more — lines textproto would reject or fold — since
// refusing is the safe side.)
func FuzzBothFramings(f *testing.F) {
	for _, s := range []string{"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "content-length:1\ntransfer-encoding:x\n",
		"Host: x\r\n", "Content-Length 5\r\n", ":\n:\n", "TRANSFER-ENCODING : chunked\r\nCONTENT-LENGTH: 1\r\n",
		"Transfer-Encoding: chunked\r\nX: a\r\n b\r\nContent-Length: 3\r\n", "Content-Length: 1\r\n\tTransfer-Encoding: x\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if bytes.Contains(raw, []byte("\r\n\r\n")) || bytes.Contains(raw, []byte("\n\n")) {
			return // an empty line ends a header block: not one block
		}
		r := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(bytes.TrimRight(raw, "\r\n"), "\r\n\r\n"...))))
		h, err := r.ReadMIMEHeader()
		if err != nil {
			return
		}
		_, cl := h["Content-Length"]
		_, te := h["Transfer-Encoding"]
		if cl && te && !bothFramings(raw) {
			t.Fatalf("bothFramings(%q) = false, but textproto reads both framings", raw)
		}
	})
}
