package fakellm

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func start(t *testing.T, p Profile) *Server {
	t.Helper()
	s, err := Start("127.0.0.1:0", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp, "READ ERROR: " + err.Error()
	}
	return resp, string(b)
}

func TestEndpoints(t *testing.T) {
	s := start(t, Profile{Tokens: 4})
	resp, body := post(t, s.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"object":"chat.completion"`) || !strings.Contains(body, `"usage"`) {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, s.URL+"/v1/chat/completions", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.Header.Get("Content-Type") != "text/event-stream" || strings.Count(body, "chat.completion.chunk") != 5 ||
		!strings.HasSuffix(body, "data: [DONE]\n\n") || !strings.Contains(body, `"usage"`) {
		t.Fatalf("sse: %s", body)
	}
	resp, body = post(t, s.URL+"/api/chat", `{"model":"llama3","messages":[{"role":"user","content":"hi"}]}`)
	lines := strings.Split(strings.TrimSpace(body), "\n")
	if resp.Header.Get("Content-Type") != "application/x-ndjson" || len(lines) != 5 || !strings.Contains(lines[4], `"done":true`) {
		t.Fatalf("ndjson: %s", body)
	}
	if _, body = post(t, s.URL+"/v1/embeddings", `{"model":"e","input":"x"}`); !strings.Contains(body, `"embedding":[`) {
		t.Fatalf("embeddings: %s", body)
	}
	if st := s.Stats(); st.Requests != 4 || st.Fates[FateOK] != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFatesAreSeededAndDeterministic(t *testing.T) {
	p := Profile{Seed: 7, Status: map[int]float64{500: 0.2, 429: 0.1}, Reset: 0.1}
	sequence := func() string {
		s := start(t, p)
		var b strings.Builder
		for i := 0; i < 60; i++ {
			fate, _, _, _ := s.fate(time.Now())
			b.WriteString(fate + ",")
		}
		return b.String()
	}
	a, b := sequence(), sequence()
	if a != b {
		t.Fatalf("same seed, different fates:\n%s\n%s", a, b)
	}
	if !strings.Contains(a, "500") || !strings.Contains(a, "reset") || !strings.Contains(a, "ok") {
		t.Fatalf("mix not represented: %s", a)
	}
}

func TestStreamFaults(t *testing.T) {
	s := start(t, Profile{Cut: 1, CutAfter: 2, Tokens: 8})
	_, body := post(t, s.URL+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if !strings.HasPrefix(body, "READ ERROR") && strings.Contains(body, "[DONE]") {
		t.Fatalf("cut stream ended cleanly: %q", body)
	}
	s2 := start(t, Profile{Stall: 1, StallAfter: 1, HangFor: 300 * time.Millisecond, Tokens: 8})
	resp, err := http.Post(s2.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.HasPrefix(first, "data: ") {
		t.Fatalf("stall: first line %q", first)
	}
}

func TestOutageWindowAndEarlyRetries(t *testing.T) {
	s := start(t, Profile{Outage: Outage{From: 0, To: 200 * time.Millisecond}})
	if resp, _ := post(t, s.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 503 {
		t.Fatalf("during outage: %d", resp.StatusCode)
	}
	time.Sleep(250 * time.Millisecond)
	if resp, _ := post(t, s.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 200 {
		t.Fatalf("after outage: %d", resp.StatusCode)
	}
	s2 := start(t, Profile{Status: map[int]float64{429: 1}, RetryAfter: time.Second})
	req, _ := http.NewRequest("POST", s2.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Request-Id", "r1")
	for i := 0; i < 2; i++ {
		resp, err := http.DefaultClient.Do(req.Clone(req.Context()))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
		}
		req.Body = io.NopCloser(strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	}
	if st := s2.Stats(); st.EarlyRetries != 1 {
		t.Fatalf("early retries %d, want 1", st.EarlyRetries)
	}
}

func TestResponsesAPI(t *testing.T) {
	s := start(t, Profile{Tokens: 3})
	resp, body := post(t, s.URL+"/v1/responses", `{"model":"m1","input":"hi"}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"object":"response"`) || !strings.Contains(body, `"output_text"`) {
		t.Fatalf("responses: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, s.URL+"/v1/responses", `{"model":"m1","input":"hi","stream":true}`)
	var types []string
	for _, line := range strings.Split(body, "\n") {
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			types = append(types, name)
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.delta " +
		"response.output_text.done response.content_part.done response.output_item.done response.completed"
	if resp.Header.Get("Content-Type") != "text/event-stream" || strings.Join(types, " ") != want {
		t.Fatalf("responses stream: %v\n%s", types, body)
	}
	cut := start(t, Profile{Tokens: 3, Cut: 1, CutAfter: 1})
	if _, body := post(t, cut.URL+"/v1/responses", `{"model":"m","stream":true,"input":"hi"}`); !strings.Contains(body, "READ ERROR") {
		t.Fatalf("a cut responses stream: %q", body)
	}
}

// TestAFakeServerRefusesWhatARealOneWould: unknown paths, wrong methods,
// bodies that are not JSON or lack what the endpoint needs get the
// server's own error shape; embeddings honour encoding_format.
func TestAFakeServerRefusesWhatARealOneWould(t *testing.T) {
	s, err := Start("127.0.0.1:0", Profile{Tokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tt := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"POST", "/v1/nonexistent", `{}`, 404, `"code":"not_found"`},
		{"GET", "/", ``, 404, `"type":"invalid_request_error"`},
		{"GET", "/v1/chat/completions", ``, 405, `takes POST`},
		{"POST", "/v1/chat/completions", `not json`, 400, `not valid JSON`},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400, `"param":"model"`},
		{"POST", "/v1/chat/completions", `{"model":"m","messages":[]}`, 400, `"param":"messages","code":"empty_array"`},
		{"POST", "/v1/responses", `{"model":"m"}`, 400, `'input'`},
		{"POST", "/api/chat", `{"model":"m"}`, 400, `{"error":"missing required parameter: 'messages'"}`},
		{"GET", "/v1/models", ``, 200, `"data":[{"id":"demo","object":"model"`},
		{"GET", "/health", ``, 200, `{"status":"ok"}`},
		{"GET", "/api/version", ``, 200, `{"version":"0.14.0"}`},
		{"POST", "/api/chat", `{"model":"m","stream":false,"messages":[{"role":"user","content":"hi"}]}`, 200, `"message":{"role":"assistant","content":"Sturdy keeps"},"done":true`},
		{"POST", "/api/generate", `{"model":"m","stream":false,"prompt":"hi"}`, 200, `"response":"Sturdy keeps","done":true`},
		{"POST", "/api/generate", `{"model":"m","prompt":"hi"}`, 200, `{"model":"m","created_at":"2026-11-30T00:00:00Z","response":"Sturdy","done":false}`},
		{"POST", "/v1/embeddings", `{"model":"e","input":["a","b","c"]}`, 200, `{"object":"embedding","index":2,"embedding":[`},
		{"POST", "/v1/embeddings", `{"model":"e","input":[1,2,3]}`, 200, `"usage":{"prompt_tokens":8,`},
		{"POST", "/v1/embeddings", `{"model":"e","input":"x","encoding_format":"base64"}`, 200, `"embedding":"`},
	} {
		req, _ := http.NewRequest(tt.method, s.URL+tt.path, strings.NewReader(tt.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.want) {
			t.Errorf("%s %s %s: %d %s", tt.method, tt.path, tt.body, resp.StatusCode, b)
		}
	}
}

// TestHealthPathsAnswerAsTheServersDo: /health and /api/version answer
// 200 while the server serves and what the outage answers in it, and
// draw no fate (the nth inference request meets the same fault with or
// without health checks between).
func TestHealthPathsAnswerAsTheServersDo(t *testing.T) {
	up := start(t, Profile{Status: map[int]float64{503: 1}})
	down := start(t, Profile{Outage: Outage{From: 0, To: time.Hour}})
	reset := start(t, Profile{Outage: Outage{From: 0, To: time.Hour, Reset: true}})
	for _, tt := range []struct {
		s      *Server
		status int
	}{{up, 200}, {down, 503}, {reset, 0}} {
		for _, path := range []string{"/health", "/api/version"} {
			resp, err := http.Get(tt.s.URL + path)
			switch {
			case tt.status == 0 && err == nil:
				resp.Body.Close()
				t.Errorf("%s in a resetting outage: %d, want the connection reset", path, resp.StatusCode)
			case tt.status != 0 && err != nil:
				t.Errorf("%s: %v", path, err)
			case tt.status != 0:
				resp.Body.Close()
				if resp.StatusCode != tt.status {
					t.Errorf("%s: %d, want %d", path, resp.StatusCode, tt.status)
				}
			}
		}
	}
	if st := up.Stats(); st.Requests != 0 || len(st.Fates) != 0 {
		t.Fatalf("health checks drew fates: %+v", st)
	}
}

// TestTheMessagesAPI: Anthropic's /v1/messages whole and streamed in its
// events, count_tokens, its errors in Anthropic's shape, and an injected
// 503 answered as Anthropic's 529 overloaded_error.
func TestTheMessagesAPI(t *testing.T) {
	s := start(t, Profile{Tokens: 3})
	const req = `{"model":"claude","max_tokens":16,"messages":[{"role":"user","content":"hi"}]`
	resp, body := post(t, s.URL+"/v1/messages", req+`}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"type":"message"`) || !strings.Contains(body, `"text":"Sturdy keeps agents"`) {
		t.Fatalf("messages: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, s.URL+"/v1/messages", req+`,"stream":true}`)
	var types []string
	for _, line := range strings.Split(body, "\n") {
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			types = append(types, name)
		}
	}
	want := "message_start content_block_start ping content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if resp.Header.Get("Content-Type") != "text/event-stream" || strings.Join(types, " ") != want {
		t.Fatalf("messages stream: %v\n%s", types, body)
	}
	if _, body = post(t, s.URL+"/v1/messages/count_tokens", `{"model":"claude","messages":[{"role":"user","content":"hi"}]}`); !strings.Contains(body, `"input_tokens":`) {
		t.Fatalf("count_tokens: %s", body)
	}
	if resp, body = post(t, s.URL+"/v1/messages", `{"model":"claude","messages":[]}`); resp.StatusCode != 400 ||
		!strings.Contains(body, `{"type":"error","error":{"type":"invalid_request_error","message":"missing required parameter: 'max_tokens'"}`) {
		t.Fatalf("no max_tokens: %d %s", resp.StatusCode, body)
	}
	busy := start(t, Profile{Status: map[int]float64{503: 1}})
	if resp, body = post(t, busy.URL+"/v1/messages", req+`}`); resp.StatusCode != 529 || !strings.Contains(body, `"type":"overloaded_error"`) {
		t.Fatalf("an injected 503: %d %s", resp.StatusCode, body)
	}
}
