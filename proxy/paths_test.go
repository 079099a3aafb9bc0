package proxy

import (
	"bytes"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestConfined(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path, prefix string
		want         bool
	}{
		{"/v1/chat/completions", "/v1/chat/", true},
		{"/v1/chat/../../admin", "/v1/chat/", false},
		{"/v1/chat/%2e%2e/%2E%2E/admin", "/v1/chat/", false},
		{"/v1/chat/.%2e/admin", "/v1/chat/", false},
		{"/v1/chat/..%2F..%2Fadmin", "/v1/chat/", false},
		{"/v1/chat/..%5c..%5cadmin", "/v1/chat/", false},
		{"/v1/chat/..\\admin", "/v1/chat/", false},
		{"/v1/chat/./completions", "/v1/chat/", true},
		{"/v1/chat/x/../completions", "/v1/chat/", true},
		{"/v1/chat/..", "/v1/chat/", false},
		{"/v1/chat/x/..", "/v1/chat/", true},
		{"/v1/chat/.", "/v1/chat/", true},
		{"/v1/models/llama3.1", "/v1/models/", true},
		{"/v1/models/org%2Fname", "/v1/", true},
		{"/v1/models/...", "/v1/models/", true}, // three dots are a name
		{"/v1/..%2e/x", "/v1/", true},           // "..." again, not a dot-segment
		{"/../../etc/passwd", "/", true},        // "/" confines nothing: any path stays under it
		{"/v1/../v1/chat/completions", "/v1/chat/", true},
		{"/v1/chatx/../chat/y", "/v1/chat", true},
		{"/v1/chat/..;/..;/admin", "/v1/chat/", false},
		{"/v1/chat/..%3B/..%3bx/admin", "/v1/chat/", false},
		{"/v1/chat/..%2F", "/v1/chat/", false},
		{"/v1/chat/x/..%2F", "/v1/chat/", true},
		{"/v1/models/org%2Fllama3.1", "/v1/models/org%2F", true},
		{"/v1/models/org%2F../../x", "/v1/models/org%2F", false},
	}
	for _, tt := range tests {
		if got := confined([]byte(tt.path), []byte(tt.prefix)); got != tt.want {
			t.Errorf("confined(%q, %q) = %v, want %v", tt.path, tt.prefix, got, tt.want)
		}
	}
}

// TestConfinedDoesNotAllocate is not parallel: AllocsPerRun counts the
// whole process's allocations.
func TestConfinedDoesNotAllocate(t *testing.T) {
	path, prefix := []byte("/v1/models/org%2Fname/../llama3.1;x"), []byte("/v1/models/")
	if n := testing.AllocsPerRun(100, func() { confined(path, prefix) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// FuzzConfined checks confined against the standard library: for a path
// of plain segments (no encodings), the resolved path path.Clean gives
// starts with the prefix exactly when confined says so.
func FuzzConfined(f *testing.F) {
	for _, s := range []string{"/v1/chat/../../admin", "/v1/chat/./x", "/a/b/../../../c", "/v1/chat/..", "//v1//chat/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "%\\") || len(p) > 200 || strings.Count(p, "/") > 60 {
			return
		}
		if _, err := url.ParseRequestURI(p); err != nil {
			return
		}
		clean := path.Clean(p)
		if strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..") {
			clean = strings.TrimSuffix(clean, "/") + "/"
		}
		prefix := "/v1/chat/"
		if !strings.HasPrefix(p, prefix) {
			return // the route matched the raw path: it starts with the prefix
		}
		if got, want := confined([]byte(p), []byte(prefix)), strings.HasPrefix(clean, prefix); got != want {
			t.Fatalf("confined(%q) = %v; path.Clean gives %q", p, got, clean)
		}
	})
}

// TestHeaderNamesAreCanonical: the names Sturdy looks up with
// PeekCanonical (no per-lookup normalizing) are written the way fasthttp
// stores them, so every lookup finds what a client or upstream sent in any
// case.
func TestHeaderNamesAreCanonical(t *testing.T) {
	t.Parallel()
	for _, k := range append([][]byte{hdrConnection, hdrAuthorization, hdrRequestID, hdrForwardedFor, hdrForwardedHost,
		hdrForwardedProto, hdrIdempotencyKey, hdrExpect, hdrRetryAfter, hdrRetryAfterMS, hdrAttempts, hdrShouldRetry,
		hdrUpstream, hdrStainlessTimeout, hdrStainlessReadTimeout, hdrRequestTimeout, hdrXRequestTimeout,
		hdrStainlessRetryCount, hdrRateLimitRemaining, hdrRateLimitReset, hdrRateLimitRemainingTokens,
		hdrRateLimitResetTokens}, hopHeaders...) {
		if bytes.Equal(k, []byte("Transfer-Encoding")) {
			continue // fasthttp keeps it as the body's framing, not as a stored header
		}
		var req fasthttp.RequestHeader
		var resp fasthttp.ResponseHeader
		lower := bytes.ToLower(k)
		req.SetBytesKV(lower, []byte("v"))
		resp.SetBytesKV(lower, []byte("v"))
		if req.PeekCanonical(k) == nil || resp.PeekCanonical(k) == nil {
			t.Errorf("%s is not how fasthttp stores %s", k, lower)
		}
	}
}
