package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
)

func TestSuccessIsForwardedWithAttemptsAndRequestID(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader, {"X-Custom", "v"}},
		Body: upstreamtest.ChatCompletion("hello")})
	h := startProxy(t, up.URL, nil)
	resp, body := h.chat("", "X-Request-Id", "req-abc")
	if resp.StatusCode != 200 || string(body) != upstreamtest.ChatCompletion("hello") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Sturdy-Attempts") != "1" || resp.Header.Get("X-Custom") != "v" ||
		resp.Header.Get("X-Request-Id") != "req-abc" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("headers: %v", resp.Header)
	}
	if got := up.Requests()[0].Header["X-Request-Id"]; got != "req-abc" {
		t.Fatalf("upstream saw X-Request-Id %q", got)
	}
	if resp.Header.Get("X-Should-Retry") != "" {
		t.Fatal("x-should-retry on a success")
	}
}

func TestGeneratedRequestIDIsForwardedAndReturned(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	resp, _ := h.do("GET", "/v1/models", "")
	id := resp.Header.Get("X-Request-Id")
	if id == "" || up.Requests()[0].Header["X-Request-Id"] != id {
		t.Fatalf("response id %q, upstream saw %q", id, up.Requests()[0].Header["X-Request-Id"])
	}
	line := h.accessLines(1)[0]
	if line["id"] != id {
		t.Fatalf("access line id %v, want %s", line["id"], id)
	}
}

func TestPassThrough4xxIsUntouched(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 401, 403, 404, 409, 422} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			body := `{"error":{"message":"bad \u00e9 input","type":"invalid_request_error","param":"messages","code":null}}` + "\n  "
			up := upstreamtest.Start(t, upstreamtest.Step{Status: status,
				Header: [][2]string{upstreamtest.JSONHeader, {"X-Upstream-Thing", "a, b"}, {"Server", "upstream/1.0"},
					{"Set-Cookie", "a=b; Path=/; HttpOnly"}, {"X-Request-Id", "upstream-id"}, {"Keep-Alive", "timeout=5"}},
				Body: body})
			h := startProxy(t, up.URL, nil)
			resp, got := h.chat("")
			if resp.StatusCode != status || string(got) != body {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, got, status, body)
			}
			// Date is the one header a proxy regenerates (as nginx does).
			if resp.Header.Get("Date") == "" {
				t.Fatal("no Date header")
			}
			resp.Header.Del("Date")
			want := http.Header{
				"Content-Type":     {"application/json"},
				"X-Upstream-Thing": {"a, b"},
				"Server":           {"upstream/1.0"},
				"Set-Cookie":       {"a=b; Path=/; HttpOnly"},
				"X-Request-Id":     {"upstream-id"},
				"Content-Length":   {strconv.Itoa(len(body))},
			}
			if !equalHeaders(resp.Header, want) {
				t.Fatalf("headers %v, want exactly %v", resp.Header, want)
			}
			if up.Count() != 1 {
				t.Fatalf("upstream saw %d requests; a 4xx must not be retried", up.Count())
			}
		})
	}
}

func equalHeaders(got, want http.Header) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if strings.Join(got.Values(k), "|") != strings.Join(v, "|") {
			return false
		}
	}
	return true
}

func TestInsufficientQuota429PassesThroughWithShouldRetryFalse(t *testing.T) {
	t.Parallel()
	body := `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{upstreamtest.JSONHeader}, Body: body})
	h := startProxy(t, up.URL, nil)
	resp, got := h.chat("")
	if resp.StatusCode != 429 || string(got) != body || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("got %d %q %v", resp.StatusCode, got, resp.Header)
	}
	if up.Count() != 1 {
		t.Fatalf("insufficient_quota retried: %d requests", up.Count())
	}
}

func TestRetryable5xxThenSuccess(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t,
		upstreamtest.Step{Status: 503, Body: "busy"},
		upstreamtest.Step{Status: 500, Body: "oops"},
		upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader}, Body: upstreamtest.ChatCompletion("ok")})
	h := startProxy(t, up.URL, nil)
	resp, body := h.chat("")
	if resp.StatusCode != 200 || string(body) != upstreamtest.ChatCompletion("ok") || resp.Header.Get("X-Sturdy-Attempts") != "3" {
		t.Fatalf("got %d %q attempts=%s", resp.StatusCode, body, resp.Header.Get("X-Sturdy-Attempts"))
	}
	line := h.accessLines(1)[0]
	retries, _ := line["retries"].([]any)
	if line["attempts"] != 3.0 || len(retries) != 2 || line["outcome"] != "ok" {
		t.Fatalf("access line %v", line)
	}
	for _, r := range retries {
		if r.(map[string]any)["reason"] != "5xx" {
			t.Fatalf("retry reason %v", r)
		}
	}
}

func TestExhaustedRetriesReturnLastReplyWithShouldRetryFalse(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t,
		upstreamtest.Step{Status: 500, Body: "first"},
		upstreamtest.Step{Status: 502, Header: [][2]string{{"X-Last", "yes"}}, Body: `{"error":"last"}`})
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].Retry.MaxAttempts = 3 })
	resp, body := h.chat("")
	if resp.StatusCode != 502 || string(body) != `{"error":"last"}` || resp.Header.Get("X-Last") != "yes" {
		t.Fatalf("got %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("X-Sturdy-Attempts") != "3" {
		t.Fatalf("headers %v", resp.Header)
	}
	if up.Count() != 3 {
		t.Fatalf("upstream saw %d requests, want max_attempts = 3", up.Count())
	}
	if l := h.accessLines(1)[0]; l["outcome"] != "exhausted" || l["stop"] != "max_attempts" {
		t.Fatalf("access line %v", l)
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		header [2]string
		wait   time.Duration
	}{
		{"Retry-After seconds", [2]string{"Retry-After", "1"}, time.Second},
		{"retry-after-ms", [2]string{"Retry-After-Ms", "400"}, 400 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t,
				upstreamtest.Step{Status: 429, Header: [][2]string{tc.header}, Body: `{"error":{"code":"rate_limit_exceeded"}}`},
				upstreamtest.Step{Body: "ok"})
			h := startProxy(t, up.URL, nil)
			resp, body := h.chat("")
			if resp.StatusCode != 200 || string(body) != "ok" {
				t.Fatalf("got %d %q", resp.StatusCode, body)
			}
			reqs := up.Requests()
			if gap := reqs[1].At.Sub(reqs[0].At); gap < tc.wait {
				t.Fatalf("retry came %v after the 429, before the %v the server asked for", gap, tc.wait)
			}
		})
	}
}

func TestRetryAfterMsWinsOverRetryAfter(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t,
		upstreamtest.Step{Status: 503, Header: [][2]string{{"Retry-After", "30"}, {"Retry-After-Ms", "100"}}},
		upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	start := time.Now()
	resp, _ := h.chat("")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %v: Retry-After won over retry-after-ms", el)
	}
}

func TestRetryAfterTooLongGoesBackAtOnce(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "60"}}, Body: "slow down"})
	h := startProxy(t, up.URL, nil)
	start := time.Now()
	resp, body := h.chat("")
	if time.Since(start) > 2*time.Second || resp.StatusCode != 429 || string(body) != "slow down" {
		t.Fatalf("got %d %q after %v", resp.StatusCode, body, time.Since(start))
	}
	if resp.Header.Get("Retry-After") != "60" || resp.Header.Get("X-Should-Retry") != "false" || up.Count() != 1 {
		t.Fatalf("headers %v, upstream count %d", resp.Header, up.Count())
	}
	if l := h.accessLines(1)[0]; l["stop"] != "retry_after_too_long" {
		t.Fatalf("access line %v", l)
	}
}

func TestRetryAfterPastDeadlineGoesBackAtOnce(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 503, Header: [][2]string{{"Retry-After", "3"}}})
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].Deadline = time.Second })
	start := time.Now()
	resp, _ := h.chat("")
	if time.Since(start) > 900*time.Millisecond || resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("got %d %v after %v", resp.StatusCode, resp.Header, time.Since(start))
	}
	if l := h.accessLines(1)[0]; l["stop"] != "deadline" {
		t.Fatalf("access line %v", l)
	}
}

func TestConnectFailureIsRetriedThenReported(t *testing.T) {
	t.Parallel()
	h := startProxy(t, "http://"+freePort(t), func(o *Options) { o.Routes[0].Retry.MaxAttempts = 3 })
	resp, body := h.chat("")
	code, d := errorOf(t, body)
	if resp.StatusCode != 502 || code != CodeRetriesExhausted || d["attempts"] != 3.0 || d["upstream"] != "up" {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("X-Sturdy-Attempts") != "3" {
		t.Fatalf("headers %v", resp.Header)
	}
}

func TestSingleConnectFailureIsUpstreamUnreachable(t *testing.T) {
	t.Parallel()
	h := startProxy(t, "http://"+freePort(t), func(o *Options) { o.Routes[0].Retry.MaxAttempts = 1 })
	resp, body := h.chat("")
	if code, _ := errorOf(t, body); resp.StatusCode != 502 || code != CodeUpstreamUnreachable {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
}

func TestNonReplayableWriteIsRetriedOnlyOnConnect(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 500, Body: "failed"})
	h := startProxy(t, up.URL, nil)
	resp, body := h.do("POST", "/v1/files", "data")
	if resp.StatusCode != 500 || string(body) != "failed" || up.Count() != 1 || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("got %d %q after %d upstream requests", resp.StatusCode, body, up.Count())
	}
	if l := h.accessLines(1)[0]; l["stop"] != "not_replayable" {
		t.Fatalf("access line %v", l)
	}
	// The same write against a closed port is retried: it never left.
	h2 := startProxy(t, "http://"+freePort(t), nil)
	resp, _ = h2.do("POST", "/v1/files", "data")
	if resp.StatusCode != 502 || resp.Header.Get("X-Sturdy-Attempts") != "4" {
		t.Fatalf("connect failure of a write: %d attempts=%s", resp.StatusCode, resp.Header.Get("X-Sturdy-Attempts"))
	}
}

func TestReplayWritesRetriesWrites(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 500}, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].Retry.ReplayWrites = true })
	resp, _ := h.do("POST", "/v1/batches", "{}")
	if resp.StatusCode != 200 || up.Count() != 2 {
		t.Fatalf("got %d after %d requests", resp.StatusCode, up.Count())
	}
}

func TestIdempotencyKeyMakesAWriteReplayable(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 502}, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	resp, _ := h.do("POST", "/v1/files", "{}", "Idempotency-Key", "k1")
	if resp.StatusCode != 200 || up.Count() != 2 {
		t.Fatalf("got %d after %d requests", resp.StatusCode, up.Count())
	}
}

func TestResetBeforeHeadersIsRetried(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Fault: upstreamtest.Reset}, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	resp, body := h.chat("")
	if resp.StatusCode != 200 || string(body) != "ok" || resp.Header.Get("X-Sturdy-Attempts") != "2" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	retries := h.accessLines(1)[0]["retries"].([]any)
	if retries[0].(map[string]any)["reason"] != "reset" {
		t.Fatalf("retry reason %v", retries)
	}
}

func TestSilentUpstreamTimesOutAndIsRetried(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Fault: upstreamtest.Hang}, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.Upstreams[0].Timeouts.FirstByte = 300 * time.Millisecond })
	start := time.Now()
	resp, body := h.chat("")
	el := time.Since(start)
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if el < 300*time.Millisecond || el > 3*time.Second {
		t.Fatalf("took %v; want about first_byte (300ms)", el)
	}
	if h.accessLines(1)[0]["retries"].([]any)[0].(map[string]any)["reason"] != "timeout" {
		t.Fatal("retry reason is not timeout")
	}
}

func TestSilentUpstreamEndsIn504(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Fault: upstreamtest.Hang})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Timeouts.FirstByte = 200 * time.Millisecond
		o.Routes[0].Retry.MaxAttempts = 2
	})
	resp, body := h.chat("")
	code, d := errorOf(t, body)
	if resp.StatusCode != 504 || code != CodeUpstreamTimeout || d["attempts"] != 2.0 {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
}

func TestHeadersWithoutFirstBodyByteTimeOut(t *testing.T) {
	t.Parallel()
	// A 200 whose first chunk never comes is a first_byte timeout, retried.
	up := upstreamtest.Start(t,
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Fault: upstreamtest.Stall},
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: upstreamtest.SSE("hi")})
	// 1 s: a loaded machine's pause must not time out the second attempt too (a third would answer).
	h := startProxy(t, up.URL, func(o *Options) { o.Upstreams[0].Timeouts.FirstByte = time.Second })
	resp, body := h.chat("")
	if resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") || resp.Header.Get("X-Sturdy-Attempts") != "2" {
		t.Fatalf("got %d %q attempts=%s", resp.StatusCode, body, resp.Header.Get("X-Sturdy-Attempts"))
	}
}

func TestDeadlineCapsTheWholeRequest(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Fault: upstreamtest.Hang})
	// Only the deadline can end it early: the upstream hangs 20 s, first_byte is 30 s. A loaded machine adds up
	// to a second or so; a deadline not kept costs 20 s.
	h := startProxy(t, up.URL, func(o *Options) {
		o.Routes[0].Deadline, o.Upstreams[0].Timeouts.FirstByte = 500*time.Millisecond, 30*time.Second
	})
	start := time.Now()
	resp, body := h.chat("")
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %v with a 500ms deadline", el)
	}
	if code, _ := errorOf(t, body); resp.StatusCode != 504 || code != CodeDeadlineExceeded {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
}

func TestBreakerOpensFastFailsAndRecovers(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 500, Body: "down"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 3, MinRequests: 1000, OpenFor: 700 * time.Millisecond}
		o.Routes[0].Retry.MaxAttempts = 2
	})
	// 1st request: 2 failures. 2nd: the 3rd failure opens the breaker
	// between retries, so it returns its last reply as exhausted.
	h.chat("")
	resp, body := h.chat("")
	if resp.StatusCode != 500 || string(body) != "down" || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("request that opened the breaker: %d %q", resp.StatusCode, body)
	}
	// 5xx are replies: the model's breaker opened, not the connection's.
	if l := h.accessLines(2)[1]; l["stop"] != "breaker_open" || l["model_breaker"] != "open" || l["breaker"] != "closed" ||
		l["targets"].([]any)[0].(map[string]any)["breaker"] != "model" {
		t.Fatalf("access line %v", l)
	}
	seen := up.Count()
	if seen != 3 {
		t.Fatalf("upstream saw %d requests before opening, want 3", seen)
	}
	// While open: 503 circuit_open at once, upstream untouched.
	start := time.Now()
	resp, body = h.chat("")
	code, _ := errorOf(t, body)
	if resp.StatusCode != 503 || code != CodeCircuitOpen || time.Since(start) > 200*time.Millisecond {
		t.Fatalf("open breaker: %d %s after %v", resp.StatusCode, body, time.Since(start))
	}
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 1 || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("circuit_open headers %v", resp.Header)
	}
	if up.Count() != seen {
		t.Fatal("upstream got traffic while the breaker was open")
	}
	// After open_for, a probe goes through; success closes the breaker.
	up.SetScript(upstreamtest.Step{Body: "back"})
	time.Sleep(800 * time.Millisecond)
	resp, body = h.chat("")
	if resp.StatusCode != 200 || string(body) != "back" {
		t.Fatalf("after open_for: %d %q", resp.StatusCode, body)
	}
	if st := h.p.tbl.Load().upstreams[0].Endpoints()[0].Models().Get("m", time.Now()).State(); st != breaker.StateClosed {
		t.Fatalf("breaker %v after a good probe", st)
	}
}

func TestPassThrough4xxAnd429DoNotTripTheBreaker(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 400, Body: "bad"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 2, MinRequests: 1000}
		o.Routes[0].Retry.MaxAttempts = 1
		// The bare 429s' doubling cooldowns are waited out between the
		// requests below; short ones keep the test fast (not tested here).
		o.Upstreams[0].Cooldown.WithoutHeader = 10 * time.Millisecond
	})
	for i := 0; i < 5; i++ {
		h.chat("")
	}
	up.SetScript(upstreamtest.Step{Status: 429, Body: "slow"})
	for i := 0; i < 5; i++ {
		h.chat("")
	}
	if st := h.p.tbl.Load().upstreams[0].Endpoints()[0].Breaker().State(); st != breaker.StateClosed {
		t.Fatalf("breaker %v after 4xx and 429s", st)
	}
}

func TestSSEChunksArriveOneByOne(t *testing.T) {
	t.Parallel()
	chunks := upstreamtest.SSE("one", "two", "three", "four")
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: chunks,
		ChunkDelay: 150 * time.Millisecond})
	h := startProxy(t, up.URL, nil)
	req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Sturdy-Attempts") != "1" {
		t.Fatalf("headers %v", resp.Header)
	}
	r := bufio.NewReader(resp.Body)
	var arrivals []time.Duration
	start := time.Now()
	var got strings.Builder
	for {
		line, err := r.ReadString('\n')
		got.WriteString(line)
		if strings.HasPrefix(line, "data: ") {
			arrivals = append(arrivals, time.Since(start))
		}
		if err != nil {
			break
		}
	}
	if got.String() != strings.Join(chunks, "") {
		t.Fatalf("stream altered:\n%q\nwant\n%q", got.String(), strings.Join(chunks, ""))
	}
	// 6 events 150 ms apart: the first must arrive long before the last.
	if len(arrivals) != len(chunks) || arrivals[len(arrivals)-1]-arrivals[0] < 500*time.Millisecond {
		t.Fatalf("events were buffered, arrivals %v", arrivals)
	}
	l := h.accessLines(1)[0]
	if l["stream"] != true || l["outcome"] != "ok" || l["bytes_out"] != float64(got.Len()) {
		t.Fatalf("access line %v", l)
	}
}

func TestStreamLongerThanTimeoutsIsNotCut(t *testing.T) {
	t.Parallel()
	// 12 chunks 100 ms apart: 1.1 s, far past first_byte and idle.
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE(upstreamtest.Words(10, "w")...), ChunkDelay: 100 * time.Millisecond})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Timeouts.FirstByte = 400 * time.Millisecond
		o.Upstreams[0].Timeouts.Idle = 400 * time.Millisecond
	})
	resp, body := h.chat(`{"stream":true}`)
	if resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("got %d, tail %q", resp.StatusCode, body[max(0, len(body)-40):])
	}
}

func TestStreamThatDiesBeforeFirstChunkIsRetried(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t,
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Fault: upstreamtest.Cut},
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: upstreamtest.SSE("hi")})
	h := startProxy(t, up.URL, nil)
	resp, body := h.chat(`{"stream":true}`)
	if resp.StatusCode != 200 || string(body) != strings.Join(upstreamtest.SSE("hi"), "") || resp.Header.Get("X-Sturdy-Attempts") != "2" {
		t.Fatalf("got %d %q attempts=%s", resp.StatusCode, body, resp.Header.Get("X-Sturdy-Attempts"))
	}
}

func TestMidStreamFailureEndsSSEWithErrorEvent(t *testing.T) {
	t.Parallel()
	chunks := upstreamtest.SSE("one", "two")[:2]
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: chunks,
		ChunkDelay: 20 * time.Millisecond, Fault: upstreamtest.Cut})
	h := startProxy(t, up.URL, nil)
	resp, body := h.chat(`{"stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	s := string(body)
	if !strings.HasPrefix(s, strings.Join(chunks, "")) {
		t.Fatalf("forwarded part altered: %q", s)
	}
	rest := strings.TrimPrefix(s, strings.Join(chunks, ""))
	if !strings.HasPrefix(rest, "data: {") || !strings.HasSuffix(rest, "}\n\n") || strings.Contains(rest, "[DONE]") {
		t.Fatalf("tail is not one error event: %q", rest)
	}
	if code, _ := errorOf(t, []byte(strings.TrimSuffix(strings.TrimPrefix(rest, "data: "), "\n\n"))); code != CodeStreamInterrupted {
		t.Fatalf("code %s", code)
	}
	if up.Count() != 1 {
		t.Fatal("a stream was retried after its first byte went out")
	}
	if l := h.accessLines(1)[0]; l["outcome"] != "stream_interrupted" {
		t.Fatalf("access line %v", l)
	}
}

func TestStalledSSEStreamEndsWithErrorEventAfterIdle(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE("one")[:1], Fault: upstreamtest.Stall})
	h := startProxy(t, up.URL, func(o *Options) { o.Upstreams[0].Timeouts.Idle = 300 * time.Millisecond })
	start := time.Now()
	_, body := h.chat(`{"stream":true}`)
	if el := time.Since(start); el < 300*time.Millisecond || el > 3*time.Second {
		t.Fatalf("stalled stream ended after %v, want about idle (300ms)", el)
	}
	if !strings.Contains(string(body), `"code":"stream_interrupted"`) || !strings.Contains(string(body), "sent nothing for 300ms") {
		t.Fatalf("body %q", body)
	}
}

func TestPartialSSEEventIsTerminatedBeforeTheErrorEvent(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: []string{upstreamtest.SSE("a")[0] + `data: {"partial":`}, Fault: upstreamtest.Cut})
	h := startProxy(t, up.URL, nil)
	_, body := h.chat(`{"stream":true}`)
	if !strings.HasPrefix(string(body), upstreamtest.SSE("a")[0]+"data: {\"partial\":\n\ndata: {\"error\"") {
		t.Fatalf("body %q", body)
	}
}

func TestMidStreamFailureEndsNDJSONWithErrorLine(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "application/x-ndjson"}},
		Chunks: []string{`{"message":{"content":"a"},"done":false}` + "\n"}, Fault: upstreamtest.Cut})
	h := startProxy(t, up.URL, nil)
	resp, body := h.do("POST", "/api/chat", `{"model":"m"}`)
	lines := strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
	if resp.StatusCode != 200 || len(lines) != 2 || !strings.HasPrefix(lines[1], `{"error":"`) {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
}

func TestMidStreamFailureOfOtherBodiesAbortsTheConnection(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "application/octet-stream"}},
		Chunks: []string{"abc"}, Fault: upstreamtest.Cut})
	h := startProxy(t, up.URL, nil)
	req, _ := http.NewRequest("GET", h.url+"/v1/files/f/content", nil)
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("a cut stream ended cleanly with %q", got)
	}
}

func TestClientGoneMidStreamClosesUpstreamAndLogs499(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE(upstreamtest.Words(200, "token")...), ChunkDelay: 20 * time.Millisecond})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000}
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"stream":true}`
	_, _ = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	buf := make([]byte, 4096)
	if _, err := conn.Read(buf); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	// The upstream notices: its next writes fail well before the stream's 4 s.
	deadline := time.Now().Add(3 * time.Second)
	for up.WriteErrors() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("upstream connection was not closed after the client left")
		}
		time.Sleep(20 * time.Millisecond)
	}
	l := h.accessLines(1)[0]
	if l["status"] != 499.0 || l["outcome"] != "client_gone" {
		t.Fatalf("access line %v", l)
	}
	if st := h.p.tbl.Load().upstreams[0].Endpoints()[0].Breaker().State(); st != breaker.StateClosed {
		t.Fatalf("client gone counted against the breaker: %v", st)
	}
}

func TestPathQueryAndHeadersForwarded(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok", Header: [][2]string{{"Connection", "X-Hop-Resp"}, {"X-Hop-Resp", "1"}}})
	h := startProxy(t, up.URL+"/prefix/", func(o *Options) { o.AllowedHosts = []string{"client.example"} }) // a loopback listener
	resp, _ := h.raw("GET /v1/a%2Fb//c?x=%20y&z=1+2 HTTP/1.1\r\nHost: client.example\r\nConnection: X-Hop\r\nX-Hop: secret\r\n" +
		"Keep-Alive: timeout=5\r\nProxy-Authorization: Basic abc\r\nTe: trailers\r\nUpgrade: h2c\r\nAuthorization: Bearer client-key\r\nX-Keep: yes\r\n\r\n")
	if resp.Header.Get("X-Hop-Resp") != "" {
		t.Fatal("header named in the upstream's Connection reached the client")
	}
	r := up.Requests()[0]
	if r.RequestURI != "/prefix/v1/a%2Fb//c?x=%20y&z=1+2" {
		t.Fatalf("upstream URI %q", r.RequestURI)
	}
	if r.Host != strings.TrimPrefix(up.URL, "http://") {
		t.Fatalf("upstream Host %q", r.Host)
	}
	for _, hop := range []string{"X-Hop", "Keep-Alive", "Proxy-Authorization", "Te", "Upgrade"} {
		if _, ok := r.Header[hop]; ok {
			t.Errorf("hop-by-hop %s forwarded", hop)
		}
	}
	if r.Header["Authorization"] != "Bearer client-key" || r.Header["X-Keep"] != "yes" || r.Header["X-Forwarded-For"] != "127.0.0.1" {
		t.Fatalf("upstream headers %v", r.Header)
	}
}

func TestAPIKeyReplacesClientAuthorization(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.Upstreams[0].APIKey = "sk-upstream-secret" })
	h.chat("", "Authorization", "Bearer sk-client-secret")
	if got := up.Requests()[0].Header["Authorization"]; got != "Bearer sk-upstream-secret" {
		t.Fatalf("upstream Authorization %q", got)
	}
	logs := h.logs.String()
	if strings.Contains(logs, "sk-upstream-secret") || strings.Contains(logs, "sk-client-secret") {
		t.Fatalf("a secret reached the log: %s", logs)
	}
}

func TestLongestPrefixRouteWins(t *testing.T) {
	t.Parallel()
	a := upstreamtest.Start(t, upstreamtest.Step{Body: "a"})
	b := upstreamtest.Start(t, upstreamtest.Step{Body: "b"})
	h := startProxy(t, a.URL, func(o *Options) {
		o.Upstreams = append(o.Upstreams, testUpstream("b", b.URL))
		r := testRoute("b")
		r.Name, r.PathPrefix = "api", "/api/"
		o.Routes = append(o.Routes, r)
	})
	if _, body := h.do("GET", "/api/tags", ""); string(body) != "b" {
		t.Fatalf("/api/tags went to %q", body)
	}
	if _, body := h.do("GET", "/v1/models", ""); string(body) != "a" {
		t.Fatalf("/v1/models went to %q", body)
	}
}

func TestNoRouteIs404(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].PathPrefix = "/v1/" })
	resp, body := h.do("GET", "/other", "")
	if code, _ := errorOf(t, body); resp.StatusCode != 404 || code != CodeRouteNotFound || up.Count() != 0 {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
}

func TestOversizedBodyIs413(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Routes[0].MaxBody = 100
		small := testRoute("up")
		small.Name, small.PathPrefix, small.MaxBody = "big", "/big/", 1000
		o.Routes = append(o.Routes, small)
	})
	// Exactly max_body is fine; one byte more is not.
	if resp, _ := h.do("POST", "/v1/chat/completions", strings.Repeat("x", 100)); resp.StatusCode != 200 {
		t.Fatalf("body of max_body bytes refused: %d", resp.StatusCode)
	}
	resp, body := h.do("POST", "/v1/chat/completions", strings.Repeat("x", 101))
	if code, _ := errorOf(t, body); resp.StatusCode != 413 || code != CodeRequestTooLarge {
		t.Fatalf("route limit: %d %s", resp.StatusCode, body)
	}
	// Over every route's limit: fasthttp refuses while reading.
	resp, body = h.do("POST", "/big/x", strings.Repeat("x", 1001))
	if code, _ := errorOf(t, body); resp.StatusCode != 413 || code != CodeRequestTooLarge {
		t.Fatalf("server limit: %d %s", resp.StatusCode, body)
	}
	if up.Count() != 1 {
		t.Fatalf("upstream saw %d requests", up.Count())
	}
	// The proxy keeps serving.
	if resp, _ := h.do("GET", "/v1/models", ""); resp.StatusCode != 200 {
		t.Fatal("proxy stopped serving")
	}
}

func TestProxyRequestsAreRefused(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	for _, raw := range []string{
		"GET http://example.com/v1/models HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
	} {
		resp, body := h.raw(raw)
		if code, _ := errorOf(t, body); resp.StatusCode != 400 || code != CodeBadRequest {
			t.Fatalf("%q: %d %s", raw, resp.StatusCode, body)
		}
	}
	if up.Count() != 0 {
		t.Fatal("a proxy request reached the upstream")
	}
}

func TestMalformedRequestGetsOpenAIError(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	resp, body := h.raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
	if code, _ := errorOf(t, body); resp.StatusCode != 400 || code != CodeBadRequest {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

func TestOneAccessLinePerRequest(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 500}, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	for i := 0; i < 5; i++ {
		h.chat("")
	}
	h.chat(`{"stream":true}`)
	time.Sleep(100 * time.Millisecond)
	if n := len(h.accessLines(6)); n != 6 {
		t.Fatalf("%d access lines for 6 requests", n)
	}
	for _, key := range []string{"id", "method", "path", "route", "upstream", "status", "attempts", "breaker", "stream",
		"bytes_out", "ttfb_ms", "duration_ms", "outcome", "time"} {
		if _, ok := h.accessLines(6)[0][key]; !ok {
			t.Errorf("access line lacks %q", key)
		}
	}
}

func TestHeadRequestKeepsContentLength(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "twelve bytes"})
	h := startProxy(t, up.URL, nil)
	resp, body := h.do("HEAD", "/v1/models", "")
	if resp.StatusCode != 200 || len(body) != 0 || resp.ContentLength != 12 {
		t.Fatalf("HEAD: %d len=%d body=%q", resp.StatusCode, resp.ContentLength, body)
	}
}

func TestLargeBodyIsStreamedIntact(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB, past the head buffer
	up := upstreamtest.Start(t, upstreamtest.Step{Body: string(big)})
	h := startProxy(t, up.URL, nil)
	resp, body := h.do("GET", "/v1/files/f/content", "")
	if resp.StatusCode != 200 || !bytes.Equal(body, big) || resp.ContentLength != int64(len(big)) {
		t.Fatalf("got %d, %d bytes (content-length %d)", resp.StatusCode, len(body), resp.ContentLength)
	}
}

func TestChunkedAndExpectContinueRequestBodiesAreForwardedWhole(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	resp, _ := h.raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n" +
		"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	r := up.Requests()[0]
	if string(r.Body) != "hello world" || r.Header["Content-Length"] != "11" || r.Header["Expect"] != "" || r.Header["Transfer-Encoding"] != "" {
		t.Fatalf("upstream got body %q headers %v", r.Body, r.Header)
	}
}

func TestTraceContextPassesThroughUntouched(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const ts = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
	h.chat("", "Traceparent", tp, "Tracestate", ts)
	r := up.Requests()[0]
	if r.Header["Traceparent"] != tp || r.Header["Tracestate"] != ts {
		t.Fatalf("trace headers changed: %v", r.Header)
	}
}

func TestRouteWithoutPathPrefixCompetesWithSlash(t *testing.T) {
	t.Parallel()
	all := upstreamtest.Start(t, upstreamtest.Step{Body: "all"})
	gpt := upstreamtest.Start(t, upstreamtest.Step{Body: "gpt"})
	h := startProxy(t, all.URL, func(o *Options) {
		o.Upstreams = append(o.Upstreams, testUpstream("gpt", gpt.URL))
		r := testRoute("gpt")
		r.Name, r.PathPrefix, r.Model = "gpt", "", "gpt*" // path_prefix left out: "/"
		o.Routes = append(o.Routes, r)
	})
	if _, body := h.chat(`{"model":"gpt-4o"}`); string(body) != "gpt" {
		t.Fatalf("the model glob lost to the / route: %q", body)
	}
	if _, body := h.chat(`{"model":"llama"}`); string(body) != "all" {
		t.Fatalf("%q", body)
	}
}

// TestForwardedHeadersAreKeptOnlyFromTrustedProxies: a client cannot pose
// as another address or host unless it is a trusted proxy.
func TestForwardedHeadersAreKeptOnlyFromTrustedProxies(t *testing.T) {
	t.Parallel()
	const posed = "GET /v1/models HTTP/1.1\r\nHost: client.example\r\nX-Forwarded-For: 1.2.3.4\r\n" +
		"X-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: https\r\nX-Forwarded-For: 5.6.7.8\r\n" +
		"X-Forwarded-Host: evil2.example\r\nX-Forwarded-Proto: https\r\n\r\n"
	for _, tt := range []struct {
		name                 string
		trusted              []netip.Prefix
		xff, xfHost, xfProto string
	}{
		{"untrusted: replaced", nil, "127.0.0.1", "client.example", "http"},
		{"other peers trusted: replaced", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, "127.0.0.1", "client.example", "http"},
		{"trusted: kept and appended", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "1.2.3.4, 5.6.7.8, 127.0.0.1", "evil2.example", "https"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
			h := startProxy(t, up.URL, func(o *Options) { o.TrustedProxies, o.AllowedHosts = tt.trusted, []string{"client.example"} })
			h.raw(posed)
			raw := up.Requests()[0].Raw
			if n := strings.Count(raw, "X-Forwarded-For:"); n != 1 {
				t.Fatalf("%d X-Forwarded-For lines reached the upstream:\n%s", n, raw)
			}
			if n := strings.Count(raw, "X-Forwarded-Host:"); (n == 1) != !strings.Contains(tt.name, "kept") {
				t.Fatalf("%d X-Forwarded-Host lines reached the upstream:\n%s", n, raw)
			}
			r := up.Requests()[0].Header
			if r["X-Forwarded-For"] != tt.xff || r["X-Forwarded-Host"] != tt.xfHost || r["X-Forwarded-Proto"] != tt.xfProto {
				t.Fatalf("upstream saw %q, %q, %q", r["X-Forwarded-For"], r["X-Forwarded-Host"], r["X-Forwarded-Proto"])
			}
		})
	}
}

// TestAnUnreachableUpstreamIsNamedWithItsCause: the error body and the
// access log name the upstream's URL and why it could not be reached —
// refused, or a certificate nobody vouches for — in fixed words.
func TestAnUnreachableUpstreamIsNamedWithItsCause(t *testing.T) {
	t.Parallel()
	cert, key := upstreamtest.SelfSigned(t)
	tlsUp := upstreamtest.StartTLS(t, cert, key, upstreamtest.Step{Body: "{}"})
	for _, tt := range []struct{ name, url, why string }{
		{"refused", "http://" + freePort(t), "connection refused"},
		{"unknown CA", tlsUp.URL, "TLS: certificate signed by unknown authority (set tls.ca_file)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := startProxy(t, tt.url, func(o *Options) { o.Routes[0].Retry.MaxAttempts = 1 })
			resp, body := h.chat("")
			if resp.StatusCode != 502 || !strings.Contains(string(body), "at "+tt.url+" ("+tt.why) {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if line := h.accessLines(1)[0]; line["cause"] != tt.why {
				t.Fatalf("access line %v", line)
			}
		})
	}
}
