package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"
)

// The rescue measurement's stream: rescueWords words, rescueGap apart.
const (
	rescueWords = 40
	rescueGap   = 10 * time.Millisecond
)

// rescueWord is the i'th word of the answer every try expects.
func rescueWord(i int) string { return fmt.Sprintf("w%02d ", i) }

// rescueTry is what one try of the rescue measurement saw: whether the
// client got the whole answer as one clean stream, and the longest gap
// between two of its words (the seam's, when it was cut).
type rescueTry struct {
	whole bool
	gap   time.Duration
}

// rescueAPI is one API the rescue measurement streams in: its path, the
// request, and the events of its stream (a server's and the client's
// reading of them).
type rescueAPI struct {
	name, path, body string
	// start is what a stream sends before its first word (id its id),
	// word one word's event, finish its clean end, failure an in-band
	// error.
	start   func(id string) string
	word    func(id, text string) string
	finish  func(id string) string
	failure string
	// continuation reads a continuation request: the answer's start it
	// carries (as the client has it), ok false for a bad request; again
	// is what the continuing server sends before its words (Messages
	// API: the space its prefill lost, which the seam drops).
	continuation func(body []byte) (kept string, ok bool)
	again        string
	// read is the client's reading of one data line: the text it adds,
	// whether it is the stream's end (done), a finish, or an error.
	read func(data string) (text string, done, finish, failed bool)
}

// rescueAPIs are the two APIs a stream is rescued on: chat completions
// and Anthropic's Messages API.
var rescueAPIs = []rescueAPI{
	{name: "chat completions", path: "/v1/chat/completions",
		body:  `{"model":"m","stream":true,"messages":[{"role":"user","content":"count"}]}`,
		start: func(id string) string { return chatEvent(id, `{"role":"assistant","content":""}`, "null") },
		word:  func(id, text string) string { return chatEvent(id, `{"content":"`+text+`"}`, "null") },
		finish: func(id string) string {
			return chatEvent(id, `{}`, `"stop"`) + "data: [DONE]\n\n"
		},
		failure:      `data: {"error":{"message":"engine died","type":"server_error","code":null}}` + "\n\n",
		continuation: prefilled,
		read: func(data string) (string, bool, bool, bool) {
			if data == "[DONE]" {
				return "", true, false, false
			}
			var ch struct {
				Error   json.RawMessage
				Choices []struct {
					Delta        struct{ Content string }
					FinishReason *string `json:"finish_reason"`
				}
			}
			if json.Unmarshal([]byte(data), &ch) != nil || ch.Error != nil || len(ch.Choices) != 1 {
				return "", false, false, true
			}
			return ch.Choices[0].Delta.Content, false, ch.Choices[0].FinishReason != nil, false
		}},
	{name: "Messages API", path: "/v1/messages",
		body: `{"model":"m","max_tokens":512,"stream":true,"messages":[{"role":"user","content":"count"}]}`,
		start: func(id string) string {
			return `event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"` + id + `","type":"message","role":"assistant","content":[],"usage":{"input_tokens":5,"output_tokens":1}}}` + "\n\n" +
				`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n"
		},
		word: func(_, text string) string {
			return `event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + text + `"}}` + "\n\n"
		},
		finish: func(string) string {
			return `event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}` + "\n\n" +
				`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":40}}` + "\n\n" +
				`event: message_stop` + "\n" + `data: {"type":"message_stop"}` + "\n\n"
		},
		failure: `event: error` + "\n" + `data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}` + "\n\n",
		again:   " ",
		continuation: func(b []byte) (string, bool) {
			kept, ok := prefilled(b)
			if !ok || kept == "" {
				return kept, ok
			}
			if strings.TrimRight(kept, " ") != kept { // Anthropic refuses a prefill ending in whitespace
				return "", false
			}
			return kept + " ", true // the whitespace Sturdy stripped, which the continuation sends again
		},
		read: func(data string) (string, bool, bool, bool) {
			var ev struct {
				Type  string
				Index int
				Delta struct {
					Type, Text string
					StopReason *string `json:"stop_reason"`
				}
			}
			if json.Unmarshal([]byte(data), &ev) != nil || ev.Type == "error" || ev.Index != 0 {
				return "", false, false, true
			}
			return ev.Delta.Text, ev.Type == "message_stop", ev.Type == "message_delta" && ev.Delta.StopReason != nil, false
		}},
}

// prefilled reads a request's trailing assistant message (the text a
// continuation carries; "" when the last message is not the assistant's),
// ok false for a body that is not a chat request.
func prefilled(b []byte) (string, bool) {
	var body struct {
		Messages []struct{ Role, Content string }
	}
	if json.Unmarshal(b, &body) != nil || len(body.Messages) == 0 {
		return "", false
	}
	if last := body.Messages[len(body.Messages)-1]; last.Role == "assistant" {
		return last.Content, true
	}
	return "", true
}

// chatEvent is a chat.completion.chunk event of stream id.
func chatEvent(id, delta, finish string) string {
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` +
		delta + `,"finish_reason":` + finish + `}]}` + "\n\n"
}

// measureRescue streams an answer tries times through Sturdy, in each
// API, from a primary that cuts each stream after a random number of
// words (or sends an in-band error there, every other try), with a
// fallback that continues a trailing assistant message (continuation:
// prefill).
func measureRescue(bin string, tries int) (map[string][]rescueTry, error) {
	out := map[string][]rescueTry{}
	for _, api := range rescueAPIs {
		ts, err := rescueOn(bin, tries, api)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", api.name, err)
		}
		out[api.name] = ts
	}
	return out, nil
}

// rescueOn is measureRescue's run in one API.
func rescueOn(bin string, tries int, api rescueAPI) ([]rescueTry, error) {
	primary, err := serveRaw(cutStreams(rand.New(rand.NewPCG(7, 13)), api))
	if err != nil {
		return nil, err
	}
	defer primary.Close()
	fallback, err := serveRaw(continueStreams(api))
	if err != nil {
		return nil, err
	}
	defer fallback.Close()
	sc := &scenario{name: "rescue", sturdy: "    continuation: none\n  - name: continuer\n    url: http://" + fallback.Addr().String() +
		"\n    continuation: prefill\nroutes:\n  - {name: default, upstream: fake, fallbacks: [{upstream: continuer}]}\n"}
	addr, _, stop, err := startSolo(bin, sc, primary.Addr())
	if err != nil {
		return nil, err
	}
	defer stop()
	var out []rescueTry
	for i := 0; i < tries; i++ {
		t, err := rescueOnce(addr, api)
		if err != nil {
			return nil, fmt.Errorf("try %d: %w", i, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// rescueOnce streams one answer through Sturdy and checks it.
func rescueOnce(addr string, api rescueAPI) (rescueTry, error) {
	resp, err := http.Post("http://"+addr+api.path, "application/json", strings.NewReader(api.body))
	if err != nil {
		return rescueTry{}, err
	}
	defer resp.Body.Close()
	var text strings.Builder
	var last time.Time
	var t rescueTry
	done, finishes, failed := 0, 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		s, end, finish, bad := api.read(data)
		if s != "" {
			if now := time.Now(); !last.IsZero() {
				t.gap = max(t.gap, now.Sub(last))
			}
			last = time.Now()
			text.WriteString(s)
		}
		done, finishes, failed = done+b2i(end), finishes+b2i(finish), failed || bad
	}
	t.whole = !failed && done == 1 && finishes == 1 && text.String() == rescueAnswer(0)
	return t, sc.Err()
}

// b2i is 1 for true.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// rescueAnswer is the answer from word i on.
func rescueAnswer(i int) string {
	var b strings.Builder
	for ; i < rescueWords; i++ {
		b.WriteString(rescueWord(i))
	}
	return b.String()
}

// serveRaw answers each connection's first request with handle.
func serveRaw(handle func(c net.Conn, req *http.Request)) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					handle(c, req)
				}
			}()
		}
	}()
	return ln, nil
}

// streamWords writes a chunked SSE response in api's events: its start
// when start is set, the words from..to, each rescueGap after the last;
// end is written after them (the finish and terminator, an error event,
// or nothing for a cut).
func streamWords(c net.Conn, api rescueAPI, id string, from, to int, start bool, end string) {
	w := bufio.NewWriter(c)
	fmt.Fprint(w, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
	chunk := func(s string) {
		fmt.Fprintf(w, "%x\r\n%s\r\n", len(s), s)
		_ = w.Flush()
	}
	if start {
		chunk(api.start(id))
	}
	for i := from; i < to; i++ {
		if i > from {
			time.Sleep(rescueGap)
		}
		chunk(api.word(id, rescueWord(i)))
	}
	if end != "" {
		chunk(end)
		fmt.Fprint(w, "0\r\n\r\n")
		_ = w.Flush()
	}
}

// cutStreams is the primary: every stream fails after a random count of
// words — cut, or an in-band error on every other stream.
func cutStreams(rnd *rand.Rand, api rescueAPI) func(net.Conn, *http.Request) {
	n := 0
	return func(c net.Conn, _ *http.Request) {
		n++
		at := 1 + rnd.IntN(rescueWords-1)
		end := ""
		if n%2 == 0 {
			end = api.failure
		}
		streamWords(c, api, "primary", 0, at, true, end)
		if tc, ok := c.(*net.TCPConn); ok && end == "" {
			_ = tc.SetLinger(0) // a reset, not a clean close
		}
	}
}

// continueStreams is the fallback: it continues the trailing assistant
// message from the word after it (a 400 for a prefill that is not the
// answer's start).
func continueStreams(api rescueAPI) func(net.Conn, *http.Request) {
	return func(c net.Conn, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		kept, ok := api.continuation(b)
		if !ok || kept != rescueAnswer(0)[:len(kept)] {
			fmt.Fprint(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			return
		}
		this := api
		if api.again != "" && kept != "" {
			this.start = func(id string) string { return api.start(id) + api.word(id, api.again) }
		}
		streamWords(c, this, "cont", strings.Count(kept, " "), rescueWords, true, api.finish("cont"))
	}
}

// rescueReport prints, per API, how many tries got the whole answer and
// the added latency at the seam: the longest gap between words, less
// rescueGap.
func rescueReport(w io.Writer, runs map[string][]rescueTry) {
	fmt.Fprintf(w, "### rescue\n%d-word streams (%v apart) cut after a random word, or failing in-band, on every try; a fallback "+
		"continues (prefill)\n\n", rescueWords, rescueGap)
	fmt.Fprintf(w, "| API | tries | whole answer | seam added p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|\n")
	for _, api := range rescueAPIs {
		tries := runs[api.name]
		if len(tries) == 0 {
			continue
		}
		var seams []time.Duration
		whole := 0
		for _, t := range tries {
			whole += b2i(t.whole)
			seams = append(seams, max(t.gap-rescueGap, 0))
		}
		sort.Slice(seams, func(i, j int) bool { return seams[i] < seams[j] })
		q := func(p float64) float64 {
			return float64(seams[min(len(seams)-1, int(p*float64(len(seams))))]) / float64(time.Millisecond)
		}
		fmt.Fprintf(w, "| %s | %d | %.1f %% | %.2f | %.2f | %.2f |\n", api.name, len(tries), 100*float64(whole)/float64(len(tries)),
			q(0.50), q(0.99), q(1))
	}
	fmt.Fprintln(w)
}
