// Package chaos is the seeded fault generator of the chaos property test
// (proxy/invariant_test.go) and of `bench -scenario chaos`: fake model
// servers whose every fault — resets, 5xx bursts, 429 storms with and
// without a wait, stalls, slow starts, streams cut past their commit
// point — is chosen from (seed, server, request index, the attempt it is
// on that server), never the clock, so a run replays from its seed; kill
// windows by request index; and the client that checks each answer
// against its canonical text.
//
// A request is numbered by its first user message, "req-<i>"; its answer
// is Words words, the same on every server, so a continuation elsewhere
// (a trailing assistant message, prefill) is checked to the word.
package chaos

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Words is the number of words of each canonical answer.
const Words = 8

// Word is word k of request i's answer.
func Word(i, k int) string { return fmt.Sprintf("w%d-%d ", k, i) }

// Answer is request i's first n words (n ≥ Words: the whole answer).
func Answer(i, n int) string {
	var b strings.Builder
	for k := 0; k < n && k < Words; k++ {
		b.WriteString(Word(i, k))
	}
	return b.String()
}

// Fault is what a server does with one attempt.
type Fault uint8

// The faults.
const (
	None      Fault = iota
	Reset           // the connection reset before any response
	Status5xx       // 503
	Wait429         // 429 with retry-after-ms (50–150 ms)
	Bare429         // 429 without a wait
	Stall           // nothing for 5 s (past any first_byte timeout)
	Slow            // a 50–150 ms start
	Cut             // a stream cut after one word or more: past the commit point
)

// Schedule chooses the fault of attempt (0 first) of request i.
type Schedule func(i, attempt int) Fault

// Rand is a uniform value in [0, 1) of (seed, parts): the same on every
// run of the seed.
func Rand(seed int64, parts ...any) float64 {
	sum := sha256.Sum256([]byte(fmt.Sprint(seed, parts)))
	return float64(binary.LittleEndian.Uint64(sum[:8])>>11) / (1 << 53)
}

// Primary is a primary's schedule: transient faults at a low rate, and in
// windows of 25 request indices (chosen by the seed) bursts of 5xx and
// storms of 429, with or without a wait. stream says cuts may happen.
func Primary(seed int64, server string, stream bool) Schedule {
	window := func(kind string, i int) bool { return Rand(seed, kind, server, i/25) < 0.15 }
	return func(i, attempt int) Fault {
		u := Rand(seed, server, i, attempt)
		switch {
		case window("burst", i) && u < 0.7:
			return Status5xx
		case window("storm", i) && u < 0.6:
			if Rand(seed, "wait", server, i/25) < 0.5 {
				return Wait429
			}
			return Bare429
		case u < 0.05:
			return Reset
		case u < 0.10:
			return Status5xx
		case u < 0.13:
			return Wait429
		case u < 0.15:
			return Bare429
		case u < 0.17:
			return Stall
		case u < 0.22:
			return Slow
		case stream && u < 0.32:
			return Cut
		}
		return None
	}
}

// Steady is a fallback's schedule: at most a slow start or a 5xx on a
// request's first attempt there — it always answers within two.
func Steady(seed int64, server string) Schedule {
	return func(i, attempt int) Fault {
		if attempt > 0 {
			return None
		}
		switch u := Rand(seed, server, i); {
		case u < 0.05:
			return Status5xx
		case u < 0.10:
			return Slow
		}
		return None
	}
}

// Down says whether server is killed while request i is sent: windows of
// 40 request indices, one in five (chosen by the seed).
func Down(seed int64, server string, i int) bool {
	return Rand(seed, "kill", server, i/40) < 0.2
}

// Server is a fake model server on a fixed loopback address: it serves
// chat completions (JSON or SSE) of the canonical answers, acting out the
// fault its schedule chooses for each attempt, and continues a trailing
// assistant message. It can be killed (nothing listens) and started again
// on its address.
type Server struct {
	Name     string
	Addr     string
	schedule Schedule // nil: never faults
	gap      time.Duration
	mu       sync.Mutex
	srv      *http.Server
	seen     map[int]int // attempts per request index
	requests atomic.Int64
}

// maxTracked bounds the request indices a server counts attempts of;
// past it every attempt of an index counts as its first.
const maxTracked = 1 << 20

// Start starts a server named name on addr ("127.0.0.1:0": any free
// port), gap between a stream's words (0: none; a real model's stream
// takes its time, and a cut of one sent at once may be seen whole by a
// proxy before it passes anything on).
func Start(name, addr string, schedule Schedule, gap time.Duration) (*Server, error) {
	s := &Server{Name: name, Addr: addr, schedule: schedule, gap: gap, seen: map[int]int{}}
	if err := s.Restart(); err != nil {
		return nil, err
	}
	return s, nil
}

// URL is the server's base URL.
func (s *Server) URL() string { return "http://" + s.Addr }

// Requests is how many requests the server received.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Restart listens on the server's address again, after a Kill (a no-op
// while it listens).
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return nil
	}
	var ln net.Listener
	var err error
	for try := 0; try < 50; try++ { // the port was just closed: it may take a moment
		if ln, err = net.Listen("tcp", s.Addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("%s: cannot listen on %s: %w", s.Name, s.Addr, err)
	}
	s.Addr = ln.Addr().String()
	s.srv = &http.Server{Handler: http.HandlerFunc(s.handle), IdleTimeout: 3 * time.Second, ReadHeaderTimeout: 5 * time.Second}
	go func(srv *http.Server) { _ = srv.Serve(ln) }(s.srv)
	return nil
}

// Kill closes the listener and every connection: nothing listens.
func (s *Server) Kill() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// SetDown kills the server (down) or starts it again.
func (s *Server) SetDown(down bool) error {
	if down {
		s.Kill()
		return nil
	}
	return s.Restart()
}

// request is what a server reads of a request.
type request struct {
	Stream   bool `json:"stream"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	var req request
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad body"}}`, 400)
		return
	}
	i, _ := strconv.Atoi(strings.TrimPrefix(req.Messages[0].Content, "req-"))
	from := 0 // a continuation: the words already sent
	if last := req.Messages[len(req.Messages)-1]; last.Role == "assistant" {
		for from = 0; from <= Words && Answer(i, from) != last.Content; from++ {
		}
		if from > Words {
			http.Error(w, `{"error":{"message":"the continuation's text is not the answer's start"}}`, 400)
			return
		}
	}
	s.mu.Lock()
	attempt := s.seen[i]
	if len(s.seen) < maxTracked {
		s.seen[i]++
	}
	s.mu.Unlock()
	fault := None
	if s.schedule != nil {
		fault = s.schedule(i, attempt)
	}
	if failed(w, r, fault, i) {
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"id":"c-%d","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}]}`,
			i, Answer(i, Words)[len(Answer(i, from)):])
		return
	}
	s.stream(w, i, from, fault == Cut)
}

// failed answers request i as fault says, before any answer: true when it
// did (Slow only waits, then the answer goes).
func failed(w http.ResponseWriter, r *http.Request, fault Fault, i int) bool {
	switch fault {
	case Reset:
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
		}
	case Status5xx:
		http.Error(w, `{"error":{"message":"overloaded"}}`, 503)
	case Wait429:
		w.Header().Set("Retry-After-Ms", strconv.Itoa(50+i%100))
		http.Error(w, `{"error":{"message":"slow down"}}`, 429)
	case Bare429:
		http.Error(w, `{"error":{"message":"slow down"}}`, 429)
	case Stall:
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	case Slow:
		time.Sleep(time.Duration(50+i%100) * time.Millisecond)
		return false
	default:
		return false
	}
	return true
}

// stream streams request i's answer from word from on, cut mid-stream
// (no last chunk, no [DONE]) when cut.
func (s *Server) stream(w http.ResponseWriter, i, from int, cut bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	event := func(delta string, finish string) {
		_, _ = fmt.Fprintf(w, `data: {"id":"c-%d","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n",
			i, delta, finish)
		fl.Flush()
	}
	event(`{"role":"assistant","content":""}`, "null")
	cutAt := -1
	if cut {
		cutAt = 1 + i%(Words/2)
	}
	for k := from; k < Words; k++ {
		if k > from && s.gap > 0 {
			time.Sleep(s.gap)
		}
		if k == cutAt {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		b, _ := json.Marshal(Word(i, k))
		event(`{"content":`+string(b)+`}`, "null")
	}
	event(`{}`, `"stop"`)
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// Ask sends request i to url (a chat completions URL), streamed or not,
// and says what is wrong with its answer ("" for nothing): a status other
// than 200, a stream not ended by [DONE] or carrying an error, or a text
// other than the canonical answer.
func Ask(ctx context.Context, client *http.Client, url string, stream bool, i int) string {
	body := fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":"req-%d"}]}`, stream, i)
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	var text strings.Builder
	if !stream {
		var c struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&c); err != nil || len(c.Choices) == 0 {
			return fmt.Sprintf("an unreadable body: %v", err)
		}
		text.WriteString(c.Choices[0].Message.Content)
	} else {
		done := false
		sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<20))
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			switch {
			case !ok:
			case data == "[DONE]":
				done = true
			case strings.Contains(data, `"error"`):
				return "an error in the stream: " + data
			default:
				var c struct {
					Choices []struct {
						Delta struct{ Content string } `json:"delta"`
					} `json:"choices"`
				}
				if json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 {
					text.WriteString(c.Choices[0].Delta.Content)
				}
			}
		}
		if err := sc.Err(); err != nil || !done {
			return fmt.Sprintf("a stream that did not end with [DONE] (%v)", err)
		}
	}
	if want := Answer(i, Words); text.String() != want {
		return fmt.Sprintf("the text %q, want %q", text.String(), want)
	}
	return ""
}
