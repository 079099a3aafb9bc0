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

// measureRescue streams an answer tries times through Sturdy from a
// primary that cuts each stream after a random number of words (or
// sends an in-band error there, every other try), with a fallback that
// continues a trailing assistant message (continuation: prefill).
func measureRescue(bin string, tries int) ([]rescueTry, error) {
	primary, err := serveRaw(cutStreams(rand.New(rand.NewPCG(7, 13))))
	if err != nil {
		return nil, err
	}
	defer primary.Close()
	fallback, err := serveRaw(continueStreams)
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
		t, err := rescueOnce(addr)
		if err != nil {
			return nil, fmt.Errorf("try %d: %w", i, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// rescueOnce streams one answer through Sturdy and checks it.
func rescueOnce(addr string) (rescueTry, error) {
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"count"}]}`
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
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
		switch {
		case !ok:
			continue
		case data == "[DONE]":
			done++
			continue
		}
		var ch struct {
			Error   json.RawMessage
			Choices []struct {
				Delta        struct{ Content string }
				FinishReason *string `json:"finish_reason"`
			}
		}
		if json.Unmarshal([]byte(data), &ch) != nil || ch.Error != nil {
			failed = true
			continue
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != "" {
				if now := time.Now(); !last.IsZero() {
					t.gap = max(t.gap, now.Sub(last))
				}
				last = time.Now()
				text.WriteString(c.Delta.Content)
			}
			if c.FinishReason != nil {
				finishes++
			}
		}
	}
	t.whole = !failed && done == 1 && finishes == 1 && text.String() == rescueAnswer(0)
	return t, sc.Err()
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

// streamWords writes a chunked SSE response of the words from..to, a
// role chunk first when role is set, each rescueGap after the last;
// end is written after them (the finish chunk and [DONE], an error
// event, or nothing for a cut).
func streamWords(c net.Conn, id string, from, to int, role bool, end string) {
	w := bufio.NewWriter(c)
	fmt.Fprint(w, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
	chunk := func(s string) {
		fmt.Fprintf(w, "%x\r\n%s\r\n", len(s), s)
		_ = w.Flush()
	}
	event := func(delta string) string {
		return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` +
			delta + `,"finish_reason":null}]}` + "\n\n"
	}
	if role {
		chunk(event(`{"role":"assistant","content":""}`))
	}
	for i := from; i < to; i++ {
		if i > from {
			time.Sleep(rescueGap)
		}
		chunk(event(`{"content":"` + rescueWord(i) + `"}`))
	}
	if end != "" {
		chunk(end)
		fmt.Fprint(w, "0\r\n\r\n")
		_ = w.Flush()
	}
}

// cutStreams is the primary: every stream fails after a random count of
// words — cut, or an in-band error on every other stream.
func cutStreams(rnd *rand.Rand) func(net.Conn, *http.Request) {
	n := 0
	return func(c net.Conn, _ *http.Request) {
		n++
		at := 1 + rnd.IntN(rescueWords-1)
		end := ""
		if n%2 == 0 {
			end = `data: {"error":{"message":"engine died","type":"server_error","code":null}}` + "\n\n"
		}
		streamWords(c, "chatcmpl-primary", 0, at, true, end)
		if tc, ok := c.(*net.TCPConn); ok && end == "" {
			_ = tc.SetLinger(0) // a reset, not a clean close
		}
	}
}

// continueStreams is the fallback: it continues the trailing assistant
// message from the word after it.
func continueStreams(c net.Conn, req *http.Request) {
	var body struct {
		Messages []struct{ Role, Content string }
	}
	b, _ := io.ReadAll(req.Body)
	if json.Unmarshal(b, &body) != nil || len(body.Messages) == 0 {
		fmt.Fprint(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
		return
	}
	last := body.Messages[len(body.Messages)-1]
	from := 0
	if last.Role == "assistant" {
		from = strings.Count(last.Content, " ")
		if last.Content != rescueAnswer(0)[:len(last.Content)] {
			fmt.Fprint(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			return
		}
	}
	finish := `data: {"id":"chatcmpl-cont","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` +
		"\n\ndata: [DONE]\n\n"
	streamWords(c, "chatcmpl-cont", from, rescueWords, true, finish)
}

// rescueReport prints how many tries got the whole answer and the added
// latency at the seam: the longest gap between words, less rescueGap.
func rescueReport(w io.Writer, tries []rescueTry) {
	var seams []time.Duration
	whole := 0
	for _, t := range tries {
		if t.whole {
			whole++
		}
		seams = append(seams, max(t.gap-rescueGap, 0))
	}
	sort.Slice(seams, func(i, j int) bool { return seams[i] < seams[j] })
	q := func(p float64) float64 {
		return float64(seams[min(len(seams)-1, int(p*float64(len(seams))))]) / float64(time.Millisecond)
	}
	fmt.Fprintf(w, "### rescue\n%d-word streams (%v apart) cut after a random word, or failing in-band, on every try; a fallback "+
		"continues (prefill)\n\n", rescueWords, rescueGap)
	fmt.Fprintf(w, "| tries | whole answer | seam added p50 ms | p99 ms | max ms |\n|---:|---:|---:|---:|---:|\n"+
		"| %d | %.1f %% | %.2f | %.2f | %.2f |\n\n", len(tries), 100*float64(whole)/float64(len(tries)), q(0.50), q(0.99), q(1))
}
