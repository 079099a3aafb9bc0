package policy

import "bytes"

// inferenceSuffixes are the path endings of calls that only compute: sending
// one twice costs tokens but changes no state, so they are replayed freely.
var inferenceSuffixes = [][]byte{
	[]byte("/chat/completions"),
	[]byte("/completions"),
	[]byte("/embeddings"),
	[]byte("/responses"),
	[]byte("/moderations"),
	[]byte("/api/chat"),
	[]byte("/api/generate"),
	[]byte("/api/embed"),
}

// Replayable reports whether a request is safe to send again after the
// upstream may have seen it: GET, HEAD and OPTIONS, any request carrying an
// Idempotency-Key, and POSTs to inference endpoints (path without query;
// one trailing slash is ignored). Other writes (files, batches, fine-tuning
// …) are not: they are retried only when the request provably never left.
func Replayable(method, path []byte, hasIdempotencyKey bool) bool {
	if hasIdempotencyKey {
		return true
	}
	switch string(method) {
	case "GET", "HEAD", "OPTIONS":
		return true
	case "POST":
	default:
		return false
	}
	if n := len(path); n > 1 && path[n-1] == '/' {
		path = path[:n-1]
	}
	for _, s := range inferenceSuffixes {
		if bytes.HasSuffix(path, s) {
			return true
		}
	}
	// Ollama's legacy embeddings endpoint ends in /api/embeddings, which
	// the /embeddings suffix above already covers.
	return false
}
