package policy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// maxServerWait bounds parsed waits so absurd values cannot overflow a
// time.Duration; anything this long is far above any max_retry_after.
const maxServerWait = 365 * 24 * time.Hour

// RetryAfter returns the wait a response asks for: retry-after-ms
// (milliseconds, may be fractional) wins over Retry-After (delay-seconds or
// an HTTP-date, relative to now). ok is false when neither header holds a
// valid value; a date in the past is a wait of zero.
func RetryAfter(retryAfterMS, retryAfter []byte, now time.Time) (wait time.Duration, ok bool) {
	if ms := bytes.TrimSpace(retryAfterMS); len(ms) > 0 {
		if f, err := strconv.ParseFloat(string(ms), 64); err == nil && f >= 0 && f == f {
			if f > float64(maxServerWait/time.Millisecond) {
				return maxServerWait, true
			}
			return time.Duration(f * float64(time.Millisecond)), true
		}
	}
	ra := bytes.TrimSpace(retryAfter)
	if len(ra) == 0 {
		return 0, false
	}
	if isDigits(ra) {
		secs, err := strconv.ParseInt(string(ra), 10, 64)
		if err != nil || secs > int64(maxServerWait/time.Second) {
			return maxServerWait, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(string(ra))
	if err != nil {
		return 0, false
	}
	d := t.Sub(now)
	if d < 0 {
		d = 0
	}
	return min(d, maxServerWait), true
}

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

// InsufficientQuota reports whether a reply's body says the account's
// billing quota is spent — OpenAI's 429 insufficient_quota
// ({"error":{"code":"insufficient_quota"}}, or the same in "type") or
// Anthropic's 402 billing_error ({"error":{"type":"billing_error"}}):
// retrying it never helps, another provider may have quota left.
func InsufficientQuota(body []byte) bool {
	if !bytes.Contains(body, []byte("insufficient_quota")) && !bytes.Contains(body, []byte("billing_error")) {
		return false
	}
	var e struct {
		Error struct {
			Code json.RawMessage `json:"code"`
			Type string          `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return false
	}
	return e.Error.Type == "insufficient_quota" || string(e.Error.Code) == `"insufficient_quota"` || e.Error.Type == "billing_error"
}
