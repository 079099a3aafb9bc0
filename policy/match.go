package policy

import (
	"bytes"
	"net/http"
	"strconv"
	"time"
)

// GlobMatch reports whether name matches pattern, where * matches any run
// of characters (slashes included: model names like "meta-llama/Llama-3"
// have them) and ? any one character.
func GlobMatch(pattern, name string) bool {
	px, nx := 0, 0
	nextPx, nextNx := -1, -1
	for px < len(pattern) || nx < len(name) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				nextPx, nextNx = px, nx+1
				px++
				continue
			case '?':
				if nx < len(name) {
					px++
					nx++
					continue
				}
			default:
				if nx < len(name) && name[nx] == c {
					px++
					nx++
					continue
				}
			}
		}
		if nextNx > 0 && nextNx <= len(name) {
			px, nx = nextPx, nextNx
			continue
		}
		return false
	}
	return true
}

// GlobSpecificity ranks patterns for "most specific wins": the number of
// literal (non-wildcard) characters.
func GlobSpecificity(pattern string) int {
	n := 0
	for i := 0; i < len(pattern); i++ {
		if pattern[i] != '*' && pattern[i] != '?' {
			n++
		}
	}
	return n
}

// ClientTimeouts are the times a client said it gives a request: head,
// until its response head (then it reads on without a bound of its
// own); total, until its last byte. Zero: none said.
type ClientTimeouts struct{ Head, Total time.Duration }

// ClientTimeout reads what a client said it gives a request, in seconds
// (decimals allowed), as each SDK means it (read in their sources):
//   - X-Stainless-Timeout: a total from OpenAI's Go SDK (lang "go": its
//     timeout spans the body); from the Node SDKs, openai's and
//     Anthropic's, until the response head (their timer is cleared as
//     fetch resolves);
//   - X-Stainless-Read-Timeout (the Python SDKs): httpx's read timeout, a
//     bound on each gap between bytes: until the head, as Sturdy holds a
//     reply until its commit;
//   - Request-Timeout, X-Request-Timeout: a total.
func ClientTimeout(stainless, lang, read, request, xRequest []byte) ClientTimeouts {
	var t ClientTimeouts
	if d, ok := parseSeconds(stainless); ok {
		if bytes.Equal(bytes.TrimSpace(lang), []byte("go")) {
			t.Total = d
		} else {
			t.Head = d
		}
	}
	if d, ok := parseSeconds(read); ok && (t.Head == 0 || d < t.Head) {
		t.Head = d
	}
	for _, h := range [...][]byte{request, xRequest} {
		if d, ok := parseSeconds(h); ok && (t.Total == 0 || d < t.Total) {
			t.Total = d
		}
	}
	return t
}

// Margin is how long before a client's timeout Sturdy answers it
// 504 deadline_exceeded (x-should-retry: false): a tenth of it, at least
// 100 ms and at most 2 s — sooner than the client gives up and retries
// what Sturdy is still trying.
func Margin(d time.Duration) time.Duration {
	return min(max(d/10, 100*time.Millisecond), 2*time.Second)
}

func parseSeconds(b []byte) (time.Duration, bool) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f <= 0 || f != f || f > maxServerWait.Seconds() {
		return 0, false
	}
	return time.Duration(f * float64(time.Second)), true
}

// RateLimitExhausted reads OpenAI's x-ratelimit headers: when
// x-ratelimit-remaining-requests is 0, it returns how long until
// x-ratelimit-reset-requests (a Go duration such as "1s", "6m0s", "20ms";
// plain seconds are accepted too).
func RateLimitExhausted(remaining, reset []byte) (time.Duration, bool) {
	if r := bytes.TrimSpace(remaining); len(r) != 1 || r[0] != '0' {
		return 0, false
	}
	s := string(bytes.TrimSpace(reset))
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return min(d, maxServerWait), true
	}
	if d, ok := parseSeconds([]byte(s)); ok {
		return d, true
	}
	return 0, false
}

// AnthropicLimitExhausted reads one of Anthropic's rate-limit pairs
// (anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
// remaining and -reset): when remaining is 0, it returns how long until
// reset — an RFC 3339 time, counted from the reply's Date (the server's
// clock; now when it has none), so a skewed clock here does not stretch
// or cut the wait. A reset already past is no wait.
func AnthropicLimitExhausted(remaining, reset, date []byte, now time.Time) (time.Duration, bool) {
	if r := bytes.TrimSpace(remaining); len(r) != 1 || r[0] != '0' {
		return 0, false
	}
	until, err := time.Parse(time.RFC3339, string(bytes.TrimSpace(reset)))
	if err != nil {
		return 0, false
	}
	from := now
	if t, err := http.ParseTime(string(date)); err == nil {
		from = t
	}
	if d := until.Sub(from); d > 0 {
		return min(d, maxServerWait), true
	}
	return 0, false
}

// RequestedRetries parses X-Stainless-Retry-Count: how many times the
// client has already retried this request itself (0 when absent).
func RequestedRetries(h []byte) int {
	if len(h) == 0 {
		return 0
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(h)))
	if err != nil || n < 0 {
		return 0
	}
	return n
}
