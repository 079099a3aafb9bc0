// Package fakellm is a fake OpenAI-compatible (and Ollama-native) model
// server with a seeded, deterministic fault profile. The bench harness,
// `sturdy -demo` and Sturdy's own tests use it.
//
// Endpoints, as the servers it stands for answer them: POST
// /v1/chat/completions (JSON, or SSE chat.completion.chunk events with
// usage and [DONE] when "stream": true; /v1/completions is answered in
// the same shape), /v1/responses
// (its stream with the output item and content part announced before the
// deltas, as OpenAI sends it), /v1/embeddings (one vector per input), GET
// /v1/models (Profile.Models), POST /api/chat and /api/generate (Ollama
// NDJSON, or one JSON object with "stream": false), Anthropic's POST
// /v1/messages (JSON, or SSE in the Messages API's events) and
// /v1/messages/count_tokens — its errors in Anthropic's shape, a 529
// overloaded_error where the others get a 503 —, the health paths GET
// /health (vLLM, llama.cpp) and /api/version (Ollama), and GET /_stats
// (counters). A request a real server refuses is refused the same way
// (refuse), before any fault.
//
// Each inference request draws its fate from the profile in arrival order
// from one seeded generator: the nth request always meets the same fault.
// Health paths draw none: they answer 200, and during the outage window
// what the outage answers.
package fakellm

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// Latency is a base delay plus a uniform random extra in [0, Jitter).
type Latency struct {
	Base   time.Duration `yaml:"base"`
	Jitter time.Duration `yaml:"jitter"`
}

// Outage makes the server answer 503 (or reset connections) from From to
// To after it starts.
type Outage struct {
	From  time.Duration `yaml:"from"`
	To    time.Duration `yaml:"to"`
	Reset bool          `yaml:"reset"`
}

// covers says whether the server's age since is inside the outage.
func (o Outage) covers(since time.Duration) bool {
	return o.To > o.From && since >= o.From && since < o.To
}

// Profile is a fault mix. Probabilities are per request, in [0, 1], and
// add up to at most 1; the rest of the requests are answered normally.
type Profile struct {
	// Seed makes the sequence of fates repeatable.
	Seed uint64 `yaml:"seed"`
	// Status maps an HTTP status (429, 500, 502, 503, 504 …) to its
	// probability.
	Status map[int]float64 `yaml:"status"`
	// RetryAfter is sent on 429s (and 503s) as Retry-After (whole seconds)
	// or, with RetryAfterMS, as retry-after-ms.
	RetryAfter   time.Duration `yaml:"retry_after"`
	RetryAfterMS bool          `yaml:"retry_after_ms"`
	// Reset closes the connection before any response.
	Reset float64 `yaml:"reset"`
	// Hang answers nothing for HangFor (default 60 s).
	Hang    float64       `yaml:"hang"`
	HangFor time.Duration `yaml:"hang_for"`
	// SlowFirstToken delays a stream's first chunk by SlowFirstTokenBy.
	SlowFirstToken   float64       `yaml:"slow_first_token"`
	SlowFirstTokenBy time.Duration `yaml:"slow_first_token_by"`
	// Cut ends a stream abruptly after CutAfter chunks.
	Cut      float64 `yaml:"cut"`
	CutAfter int     `yaml:"cut_after"`
	// Stall stops a stream after StallAfter chunks and keeps it open for
	// HangFor.
	Stall      float64 `yaml:"stall"`
	StallAfter int     `yaml:"stall_after"`
	// TTFT is the time to the first token (headers are sent at once);
	// InterToken the gap between chunks; Tokens the number of content
	// chunks per reply (default 16).
	TTFT       Latency `yaml:"ttft"`
	InterToken Latency `yaml:"inter_token"`
	Tokens     int     `yaml:"tokens"`
	// Outage takes the server down for a window.
	Outage Outage `yaml:"outage"`
	// Models are the names GET /v1/models lists (default "demo", the
	// name the docs' examples use).
	Models []string `yaml:"models"`
}

// Fates a request can meet.
const (
	FateOK     = "ok"
	FateReset  = "reset"
	FateHang   = "hang"
	FateSlow   = "slow_first_token"
	FateCut    = "cut"
	FateStall  = "stall"
	FateOutage = "outage"
)

// Stats are the server's counters.
type Stats struct {
	Requests int64            `json:"requests"`
	Fates    map[string]int64 `json:"fates"`
	// EarlyRetries counts requests that came back (same X-Request-Id)
	// before the Retry-After their 429 asked for.
	EarlyRetries int64 `json:"early_retries"`
	// InOutage counts requests received during the outage window.
	InOutage int64 `json:"in_outage"`
}

// Server is a running fake model server.
type Server struct {
	// URL is http://host:port.
	URL     string
	Addr    string
	profile Profile
	srv     *fasthttp.Server
	ln      net.Listener
	start   time.Time
	done    chan struct{}

	mu    sync.Mutex
	rng   *rand.Rand
	fates map[string]int64
	// retryAt is when each request id (that got a 429) may come back.
	retryAt map[string]time.Time

	requests, early, inOutage atomic.Int64
}

// maxRetryAt bounds the request ids remembered for EarlyRetries.
const maxRetryAt = 100_000

// Start serves profile on addr ("127.0.0.1:0" for any free port).
func Start(addr string, p Profile) (*Server, error) {
	if p.Tokens <= 0 {
		p.Tokens = 16
	}
	if p.HangFor <= 0 {
		p.HangFor = 60 * time.Second
	}
	if len(p.Models) == 0 {
		p.Models = []string{"demo"}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + ln.Addr().String(), Addr: ln.Addr().String(), profile: p, ln: ln,
		start: time.Now(), done: make(chan struct{}), rng: rand.New(rand.NewPCG(p.Seed, p.Seed^0x5eed)),
		fates: map[string]int64{}, retryAt: map[string]time.Time{}}
	s.srv = &fasthttp.Server{Handler: s.handle, Logger: quiet{}, CloseOnShutdown: true,
		NoDefaultServerHeader: true, Concurrency: 1 << 20}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// Close stops the server, ending hanging requests.
func (s *Server) Close() {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	_ = s.srv.Shutdown()
}

// Reset restarts the clock of the outage window and zeroes the counters
// (the fault sequence goes on), so a measurement starts clean.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.start = time.Now()
	s.fates = map[string]int64{}
	s.retryAt = map[string]time.Time{}
	s.requests.Store(0)
	s.early.Store(0)
	s.inOutage.Store(0)
}

// Stats returns the counters so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := make(map[string]int64, len(s.fates))
	for k, v := range s.fates {
		f[k] = v
	}
	return Stats{Requests: s.requests.Load(), Fates: f, EarlyRetries: s.early.Load(), InOutage: s.inOutage.Load()}
}

// fate draws the next request's fate and latencies.
func (s *Server) fate(now time.Time) (fate string, status int, ttft, itl time.Duration) {
	p := &s.profile
	s.mu.Lock()
	defer s.mu.Unlock()
	start := s.start
	jitter := func(l Latency) time.Duration {
		if l.Jitter <= 0 {
			return l.Base
		}
		return l.Base + time.Duration(s.rng.Int64N(int64(l.Jitter)))
	}
	ttft, itl = jitter(p.TTFT), jitter(p.InterToken)
	x := s.rng.Float64()
	if p.Outage.covers(now.Sub(start)) {
		s.fates[FateOutage]++
		s.inOutage.Add(1)
		return FateOutage, 503, ttft, itl
	}
	for _, code := range []int{429, 500, 502, 503, 504} {
		if x -= p.Status[code]; x < 0 {
			s.fates[strconv.Itoa(code)]++
			return strconv.Itoa(code), code, ttft, itl
		}
	}
	for _, f := range []struct {
		name string
		p    float64
	}{{FateReset, p.Reset}, {FateHang, p.Hang}, {FateSlow, p.SlowFirstToken}, {FateCut, p.Cut}, {FateStall, p.Stall}} {
		if x -= f.p; x < 0 {
			s.fates[f.name]++
			return f.name, 200, ttft, itl
		}
	}
	s.fates[FateOK]++
	return FateOK, 200, ttft, itl
}

// ResetConn closes c with a TCP reset (linger 0), the way a crashed or
// overloaded server drops a connection.
func ResetConn(c net.Conn) {
	if l, ok := c.(interface{ SetLinger(int) error }); ok {
		_ = l.SetLinger(0)
	}
	_ = c.Close()
}

// ResetBeforeResponse drops the request's connection without answering.
func ResetBeforeResponse(ctx *fasthttp.RequestCtx) {
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(ResetConn)
}

// sleep waits d unless the server closes; false if it closed.
func (s *Server) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.done:
		return false
	}
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	if path == "/_stats" {
		ctx.SetContentType("application/json")
		_ = json.NewEncoder(ctx).Encode(s.Stats())
		return
	}
	now := time.Now()
	if path == "/health" || path == "/api/version" {
		s.health(ctx, path, now)
		return
	}
	s.requests.Add(1)
	if refuse(ctx, path) { // a client's mistake is answered as a real server would, before any fault
		return
	}
	s.noteRetry(string(ctx.Request.Header.Peek("X-Request-Id")), now)
	fate, status, ttft, itl := s.fate(now)
	p := &s.profile
	switch {
	case fate == FateOutage && p.Outage.Reset, fate == FateReset:
		ResetBeforeResponse(ctx)
		return
	case fate == FateHang:
		s.sleep(p.HangFor)
		ctx.SetConnectionClose()
		return
	case status != 200:
		s.fail(ctx, status)
		return
	}
	body := ctx.Request.Body()
	model := gjson.GetBytes(body, "model").String()
	if model == "" {
		model = "fake-model"
	}
	switch path {
	case "/v1/models":
		s.models(ctx)
	case "/v1/embeddings":
		s.sleep(ttft)
		writeEmbeddings(ctx, model, inputs(gjson.GetBytes(body, "input")), gjson.GetBytes(body, "encoding_format").String() == "base64")
	case "/api/chat":
		s.ollama(ctx, body, fate, model, ttft, itl, formatOllama)
	case "/api/generate":
		s.ollama(ctx, body, fate, model, ttft, itl, formatOllamaGenerate)
	case "/v1/responses":
		s.generate(ctx, body, fate, model, ttft, itl, formatResponses)
	case "/v1/messages":
		s.generate(ctx, body, fate, model, ttft, itl, formatAnthropic)
	case "/v1/messages/count_tokens":
		ctx.SetContentType("application/json")
		fmt.Fprintf(ctx, `{"input_tokens":%d}`, 1+len(gjson.GetBytes(body, "messages").Raw)/4)
	default: // /v1/chat/completions and anything else chat-like
		s.generate(ctx, body, fate, model, ttft, itl, formatChat)
	}
}

// generate answers a chat completions or Responses request: streamed in
// format f when the body asks for it, else whole, once every token is
// "generated".
func (s *Server) generate(ctx *fasthttp.RequestCtx, body []byte, fate, model string, ttft, itl time.Duration, f format) {
	p := &s.profile
	if gjson.GetBytes(body, "stream").Bool() {
		s.stream(ctx, fate, model, ttft, itl, f)
		return
	}
	if !s.sleep(ttft + time.Duration(p.Tokens-1)*itl) {
		return
	}
	ctx.SetContentType("application/json")
	switch f {
	case formatResponses:
		ctx.WriteString(responseJSON(model, p.Tokens))
		return
	case formatAnthropic:
		fmt.Fprintf(ctx, `{"id":"msg_fake","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":%q}],`+
			`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":%d}}`, model, content(p.Tokens), p.Tokens)
		return
	}
	fmt.Fprintf(ctx, `{"id":"chatcmpl-fake","object":"chat.completion","created":1700000000,"model":%q,`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}`,
		model, content(p.Tokens), p.Tokens, 12+p.Tokens)
}

// models answers /v1/models with Profile.Models.
func (s *Server) models(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.WriteString(`{"object":"list","data":[`)
	for i, m := range s.profile.Models {
		if i > 0 {
			ctx.WriteString(",")
		}
		fmt.Fprintf(ctx, `{"id":%q,"object":"model","created":1700000000,"owned_by":"fakellm"}`, m)
	}
	ctx.WriteString("]}")
}

// health answers /health (vLLM, llama.cpp: 200 when serving) and
// /api/version (Ollama) without drawing a fate; in the outage window it
// answers what the outage does (503, or a reset), as a down server would.
func (s *Server) health(ctx *fasthttp.RequestCtx, path string, now time.Time) {
	p := &s.profile
	s.mu.Lock()
	since := now.Sub(s.start)
	s.mu.Unlock()
	if p.Outage.covers(since) {
		if p.Outage.Reset {
			ResetBeforeResponse(ctx)
			return
		}
		ctx.SetStatusCode(503)
		ctx.SetContentType("application/json")
		ctx.WriteString(`{"error":"fakellm: in its outage"}`)
		return
	}
	ctx.SetContentType("application/json")
	if path == "/api/version" {
		ctx.WriteString(`{"version":"0.14.0"}`)
		return
	}
	ctx.WriteString(`{"status":"ok"}`)
}

// ollama answers /api/chat and /api/generate: NDJSON unless the body says
// "stream": false (Ollama streams by default), then one JSON object.
func (s *Server) ollama(ctx *fasthttp.RequestCtx, body []byte, fate, model string, ttft, itl time.Duration, f format) {
	if st := gjson.GetBytes(body, "stream"); !st.Exists() || st.Bool() {
		s.stream(ctx, fate, model, ttft, itl, f)
		return
	}
	p := &s.profile
	if !s.sleep(ttft + time.Duration(p.Tokens-1)*itl) {
		return
	}
	ctx.SetContentType("application/json")
	field := `"message":{"role":"assistant","content":%q}`
	if f == formatOllamaGenerate {
		field = `"response":%q`
	}
	fmt.Fprintf(ctx, `{"model":%q,"created_at":"2026-11-30T00:00:00Z",`+field+`,"done":true,"done_reason":"stop","prompt_eval_count":12,"eval_count":%d}`,
		model, content(p.Tokens), p.Tokens)
}

// maxInputs is the most inputs one embeddings request is answered for
// (OpenAI's own limit), so a reply stays a bounded multiple of a request.
const maxInputs = 2048

// inputs is how many inputs an embeddings request has: a string or an
// array of tokens is one, an array of strings or of token arrays is one
// each (at most maxInputs).
func inputs(in gjson.Result) int {
	if !in.IsArray() {
		return 1
	}
	arr := in.Array()
	if len(arr) == 0 || arr[0].Type == gjson.Number {
		return 1
	}
	return min(len(arr), maxInputs)
}

// writeEmbeddings answers an embeddings request of n inputs with a fixed
// 64-dimension vector each: floats, or with encoding_format base64 (what
// the Node SDK asks for) the little-endian float32s in base64, as OpenAI
// sends them.
func writeEmbeddings(ctx *fasthttp.RequestCtx, model string, n int, b64 bool) {
	ctx.SetContentType("application/json")
	ctx.WriteString(`{"object":"list","data":[`)
	for i := range n {
		if i > 0 {
			ctx.WriteString(",")
		}
		fmt.Fprintf(ctx, `{"object":"embedding","index":%d,"embedding":`, i)
		writeVector(ctx, b64)
		ctx.WriteString("}")
	}
	fmt.Fprintf(ctx, `],"model":%q,"usage":{"prompt_tokens":%d,"total_tokens":%d}}`, model, 8*n, 8*n)
}

// writeVector writes the fixed vector, as floats or base64.
func writeVector(ctx *fasthttp.RequestCtx, b64 bool) {
	vec := make([]float32, 64)
	for i := range vec {
		vec[i] = float32(i%7)/7 - 0.5
	}
	if b64 {
		raw := make([]byte, 4*len(vec))
		for i, v := range vec {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
		}
		fmt.Fprintf(ctx, "%q", base64.StdEncoding.EncodeToString(raw))
	} else {
		ctx.WriteString("[")
		for i, v := range vec {
			if i > 0 {
				ctx.WriteString(",")
			}
			fmt.Fprintf(ctx, "%.4f", v)
		}
		ctx.WriteString("]")
	}
}

// endpoints are the paths the fake server serves, with the method and
// the body fields each needs (what a real server rejects without them).
var endpoints = map[string]struct {
	method string
	needs  []string
	ollama bool
}{
	"/v1/chat/completions":      {method: "POST", needs: []string{"model", "messages"}},
	"/v1/completions":           {method: "POST", needs: []string{"model", "prompt"}},
	"/v1/responses":             {method: "POST", needs: []string{"model", "input"}},
	"/v1/embeddings":            {method: "POST", needs: []string{"model", "input"}},
	"/v1/models":                {method: "GET"},
	"/api/chat":                 {method: "POST", needs: []string{"model", "messages"}, ollama: true},
	"/api/generate":             {method: "POST", needs: []string{"model"}, ollama: true},
	"/v1/messages":              {method: "POST", needs: []string{"model", "messages", "max_tokens"}},
	"/v1/messages/count_tokens": {method: "POST", needs: []string{"model", "messages"}},
}

// refuse answers a request a real server would refuse — an unknown path
// (404), a wrong method (405), a body that is not JSON or lacks what the
// endpoint needs (400) — in the server's own error shape, and reports
// whether it did.
func refuse(ctx *fasthttp.RequestCtx, path string) bool {
	ep, ok := endpoints[path]
	var status int
	var msg, param string
	body := ctx.Request.Body()
	switch {
	case !ok:
		status, msg = 404, fmt.Sprintf("unknown path %s (this fake server serves /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/models, /v1/messages, /v1/messages/count_tokens, /api/chat, /api/generate, /health, /api/version)", path)
	case string(ctx.Method()) != ep.method:
		status, msg = 405, fmt.Sprintf("%s takes %s, not %s", path, ep.method, ctx.Method())
	case ep.method == "POST" && !gjson.ValidBytes(body):
		status, msg = 400, "the request body is not valid JSON"
	case ep.method == "POST" && !gjson.ParseBytes(body).IsObject():
		status, msg = 400, "the request body must be a JSON object"
	default:
		for _, f := range ep.needs {
			if !gjson.GetBytes(body, f).Exists() {
				status, msg, param = 400, fmt.Sprintf("missing required parameter: '%s'", f), f
				break
			}
		}
		if m := gjson.GetBytes(body, "messages"); status == 0 && !ep.ollama && m.IsArray() && len(m.Array()) == 0 {
			status, param = 400, "messages"
			msg = "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead."
		}
	}
	if status == 0 {
		return false
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	switch {
	case ep.ollama:
		fmt.Fprintf(ctx, `{"error":%q}`, msg)
		return true
	case anthropicPath(path):
		typ := "invalid_request_error"
		if status == 404 {
			typ = "not_found_error"
		}
		fmt.Fprintf(ctx, `{"type":"error","error":{"type":%q,"message":%q},"request_id":"req_fake"}`, typ, msg)
		return true
	}
	typ, code := "invalid_request_error", "null"
	switch {
	case status == 404:
		code = `"not_found"`
	case param == "messages":
		code = `"empty_array"`
	}
	p := "null"
	if param != "" {
		p = strconv.Quote(param)
	}
	fmt.Fprintf(ctx, `{"error":{"message":%q,"type":%q,"param":%s,"code":%s}}`, msg, typ, p, code)
	return true
}

// anthropicPath says whether path is the Messages API's: its errors are
// in Anthropic's shape.
func anthropicPath(path string) bool { return strings.HasPrefix(path, "/v1/messages") }

// noteRetry counts a request that returns before its 429's Retry-After.
func (s *Server) noteRetry(id string, now time.Time) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if at, ok := s.retryAt[id]; ok {
		if now.Before(at) {
			s.early.Add(1)
		}
		delete(s.retryAt, id)
	}
}

func (s *Server) fail(ctx *fasthttp.RequestCtx, status int) {
	p := &s.profile
	if (status == 429 || status == 503) && p.RetryAfter > 0 {
		if p.RetryAfterMS {
			ctx.Response.Header.Set("retry-after-ms", strconv.FormatInt(p.RetryAfter.Milliseconds(), 10))
		} else {
			ctx.Response.Header.Set("Retry-After", strconv.FormatInt(int64((p.RetryAfter+time.Second-1)/time.Second), 10))
		}
		if id := string(ctx.Request.Header.Peek("X-Request-Id")); id != "" && status == 429 {
			wait := p.RetryAfter
			if !p.RetryAfterMS {
				wait = (p.RetryAfter + time.Second - 1) / time.Second * time.Second
			}
			s.mu.Lock()
			if len(s.retryAt) >= maxRetryAt { // ids that never came back: forget them all
				clear(s.retryAt)
			}
			s.retryAt[id] = time.Now().Add(wait)
			s.mu.Unlock()
		}
	}
	ctx.SetContentType("application/json")
	if anthropicPath(string(ctx.Path())) {
		// Anthropic's shape; its overload is a 529.
		if status == 503 {
			status = 529
		}
		typ := map[int]string{429: "rate_limit_error", 529: "overloaded_error"}[status]
		if typ == "" {
			typ = "api_error"
		}
		ctx.SetStatusCode(status)
		fmt.Fprintf(ctx, `{"type":"error","error":{"type":%q,"message":"fakellm: injected %d"},"request_id":"req_fake"}`, typ, status)
		return
	}
	ctx.SetStatusCode(status)
	code := map[int]string{429: "rate_limit_exceeded", 503: "overloaded"}[status]
	fmt.Fprintf(ctx, `{"error":{"message":"fakellm: injected %d","type":"server_error","param":null,"code":%q}}`, status, code)
}

// stream sends the reply as SSE chat.completion.chunk events (or Ollama
// NDJSON), acting out slow-first-token, cut and stall fates.
func (s *Server) stream(ctx *fasthttp.RequestCtx, fate, model string, ttft, itl time.Duration, f format) {
	p := s.profile
	if fate == FateSlow {
		ttft += p.SlowFirstTokenBy
	}
	if fate == FateCut {
		// A cut must look like a dropped connection, not a clean end.
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			w := bufio.NewWriter(c)
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n", f.contentType())
			if pre := f.prelude(model); pre != "" {
				fmt.Fprintf(w, "%x\r\n%s\r\n", len(pre), pre)
			}
			_ = w.Flush()
			s.sleep(ttft)
			for i := 0; i < p.CutAfter; i++ {
				ev := f.event(model, i)
				fmt.Fprintf(w, "%x\r\n%s\r\n", len(ev), ev)
				_ = w.Flush()
				s.sleep(itl)
			}
			ResetConn(c)
		})
		return
	}
	ctx.SetContentType(f.contentType())
	if f.contentType() == "text/event-stream" {
		ctx.Response.Header.Set("Cache-Control", "no-cache")
	}
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		if pre := f.prelude(model); pre != "" { // framing comes at once, output after ttft
			w.WriteString(pre)
			if w.Flush() != nil {
				return
			}
		}
		if !s.sleep(ttft) {
			return
		}
		for i := 0; i < p.Tokens; i++ {
			if i > 0 && !s.sleep(itl) {
				return
			}
			if fate == FateStall && i == p.StallAfter {
				s.sleep(p.HangFor)
				return
			}
			w.WriteString(f.event(model, i))
			if w.Flush() != nil {
				return
			}
		}
		w.WriteString(f.end(model, p.Tokens))
		_ = w.Flush()
	})
}

// format is the shape of a streamed reply.
type format uint8

// The stream formats the fake server speaks.
const (
	formatChat           format = iota // chat completions SSE
	formatOllama                       // Ollama /api/chat NDJSON
	formatOllamaGenerate               // Ollama /api/generate NDJSON
	formatResponses                    // Responses API SSE
	formatAnthropic                    // Anthropic Messages API SSE
)

func (f format) contentType() string {
	if f == formatOllama || f == formatOllamaGenerate {
		return "application/x-ndjson"
	}
	return "text/event-stream"
}

// responsesPrelude is how many events a Responses stream sends before its
// first delta.
const responsesPrelude = 4

// prelude is what a stream sends before its first token: the Responses
// API's response.created and response.in_progress, then the message item
// and its text part announced (empty), as OpenAI sends them — the SDKs'
// stream helpers put each delta into the item and part announced.
func (f format) prelude(model string) string {
	if f == formatAnthropic {
		return fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_fake\",\"type\":\"message\","+
			"\"role\":\"assistant\",\"model\":%q,\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"+
			"\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n", model) +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
			"event: ping\ndata: {\"type\":\"ping\"}\n\n"
	}
	if f != formatResponses {
		return ""
	}
	resp := fmt.Sprintf(`{"id":"resp_fake","object":"response","created_at":1700000000,"status":"in_progress","model":%q,"output":[]}`, model)
	return fmt.Sprintf("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":%s}\n\n", resp) +
		fmt.Sprintf("event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":%s}\n\n", resp) +
		"event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0," +
		"\"item\":{\"type\":\"message\",\"id\":\"msg_fake\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n" +
		"event: response.content_part.added\ndata: {\"type\":\"response.content_part.added\",\"sequence_number\":3,\"item_id\":\"msg_fake\"," +
		"\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n"
}

// event is the stream's i-th token.
func (f format) event(model string, i int) string {
	tok := word(i)
	switch f {
	case formatOllama:
		return fmt.Sprintf(`{"model":%q,"created_at":"2026-11-30T00:00:00Z","message":{"role":"assistant","content":%q},"done":false}`+"\n", model, tok)
	case formatOllamaGenerate:
		return fmt.Sprintf(`{"model":%q,"created_at":"2026-11-30T00:00:00Z","response":%q,"done":false}`+"\n", model, tok)
	case formatAnthropic:
		return fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":%q}}\n\n", tok)
	case formatResponses:
		return fmt.Sprintf("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_fake\",\"output_index\":0,\"content_index\":0,\"delta\":%q,\"sequence_number\":%d}\n\n", tok, responsesPrelude+i)
	}
	return fmt.Sprintf(`data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":1700000000,"model":%q,"choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`+"\n\n", model, tok)
}

// end closes a stream of n tokens with its terminator.
func (f format) end(model string, n int) string {
	switch f {
	case formatOllama:
		return fmt.Sprintf(`{"model":%q,"created_at":"2026-11-30T00:00:00Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","eval_count":%d}`+"\n", model, n)
	case formatOllamaGenerate:
		return fmt.Sprintf(`{"model":%q,"created_at":"2026-11-30T00:00:00Z","response":"","done":true,"done_reason":"stop","eval_count":%d}`+"\n", model, n)
	case formatAnthropic:
		return "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
			fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":%d}}\n\n", n) +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	case formatResponses:
		seq, text := responsesPrelude+n, content(n)
		return fmt.Sprintf("event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"sequence_number\":%d,\"item_id\":\"msg_fake\",\"output_index\":0,\"content_index\":0,\"text\":%q}\n\n", seq, text) +
			fmt.Sprintf("event: response.content_part.done\ndata: {\"type\":\"response.content_part.done\",\"sequence_number\":%d,\"item_id\":\"msg_fake\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":%q,\"annotations\":[]}}\n\n", seq+1, text) +
			fmt.Sprintf("event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"sequence_number\":%d,\"output_index\":0,\"item\":%s}\n\n", seq+2, messageJSON(n)) +
			fmt.Sprintf("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":%d,\"response\":%s}\n\n", seq+3, responseJSON(model, n))
	}
	return fmt.Sprintf(`data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":1700000000,"model":%q,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}`+"\n\ndata: [DONE]\n\n", model, n, 12+n)
}

// responseJSON is a completed Responses API response of n tokens.
func responseJSON(model string, n int) string {
	return fmt.Sprintf(`{"id":"resp_fake","object":"response","created_at":1700000000,"status":"completed","model":%q,`+
		`"output":[%s],"usage":{"input_tokens":12,"output_tokens":%d,"total_tokens":%d}}`, model, messageJSON(n), n, 12+n)
}

// messageJSON is the completed message item of n tokens.
func messageJSON(n int) string {
	return fmt.Sprintf(`{"type":"message","id":"msg_fake","status":"completed","role":"assistant","content":[{"type":"output_text","text":%q,"annotations":[]}]}`, content(n))
}

var words = []string{"Sturdy", " keeps", " agents", " running", " when", " model", " servers", " stumble", "."}

func word(i int) string { return words[i%len(words)] }

func content(n int) string {
	out := ""
	for i := 0; i < n; i++ {
		out += word(i)
	}
	return out
}
