package policy

import (
	"strings"
	"testing"
	"time"
)

// Fuzz targets: the parsers of server- and client-given values. Their
// seeds run in every `go test`; `go test -fuzz FuzzRetryAfter ./policy`
// explores further.

func FuzzRetryAfter(f *testing.F) {
	for _, s := range [][2]string{{"", "3"}, {"1500", ""}, {"20.5", "10"}, {"", "Mon, 30 Nov 2026 12:00:05 GMT"},
		{"-1", "-1"}, {"1e308", "99999999999999999999"}, {"NaN", "Inf"}, {" 7 ", "0x10"}} {
		f.Add(s[0], s[1])
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ms, header string) {
		d, ok := RetryAfter([]byte(ms), []byte(header), now)
		if d < 0 || d > maxServerWait || (!ok && d != 0) {
			t.Fatalf("RetryAfter(%q, %q) = %v, %v", ms, header, d, ok)
		}
	})
}

func FuzzRateLimitExhausted(f *testing.F) {
	for _, s := range [][2]string{{"0", "1s"}, {"0", "6m0s"}, {"0", "20ms"}, {"1", "1s"}, {"0", "-5s"}, {"0", "9999999h"}, {"0", "1.5"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, remaining, reset string) {
		d, ok := RateLimitExhausted([]byte(remaining), []byte(reset))
		if d < 0 || d > maxServerWait || (!ok && d != 0) {
			t.Fatalf("RateLimitExhausted(%q, %q) = %v, %v", remaining, reset, d, ok)
		}
	})
}

func FuzzClientTimeout(f *testing.F) {
	for _, s := range []string{"600", "2.5", "0", "-1", "1e400", "NaN", " 30 ", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := parseSeconds([]byte(v))
		if ok != (d > 0) || d > maxServerWait {
			t.Fatalf("parseSeconds(%q) = %v, %v", v, d, ok)
		}
	})
}

func FuzzGlobMatch(f *testing.F) {
	for _, s := range [][2]string{{"gpt-4o*", "gpt-4o-mini"}, {"*", ""}, {"a*b*c", "aXbYc"}, {"??", "é"}, {"***", "x"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		got := GlobMatch(pattern, name)
		if !strings.ContainsAny(pattern, "*?") && got != (pattern == name) {
			t.Fatalf("literal %q vs %q = %v", pattern, name, got)
		}
		if !GlobMatch("*", name) || !GlobMatch(pattern+"*", pattern) && !strings.ContainsAny(pattern, "*?") {
			t.Fatalf("wildcards failed on %q / %q", pattern, name)
		}
	})
}

func FuzzClassify(f *testing.F) {
	for _, s := range []int{200, 400, 429, 500, 599, 0, -1, 1000} {
		f.Add(s, uint8(0), false)
	}
	f.Fuzz(func(t *testing.T, status int, fault uint8, quota bool) {
		v := Classify(Outcome{Status: status, Fault: Fault(fault % 5), InsufficientQuota: quota})
		if (v.Class == ClassRetryable) != (v.Reason != ReasonNone) {
			t.Fatalf("class %v with reason %v", v.Class, v.Reason)
		}
	})
}
