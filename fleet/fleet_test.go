package fleet

import (
	"context"
	"encoding/hex"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestDigestIsStable: a credential's key is the same in every process
// (a golden value), and the hash key changes it.
func TestDigestIsStable(t *testing.T) {
	for _, tt := range []struct{ hashKey, want string }{
		{"", "721f7fc017ef3e03b71b119232465741"},      // SHA-256 of "Bearer sk-x\x00gpt-4o"
		{"fleet", "c91a8ffc75d0a5828ce871788a78116d"}, // HMAC-SHA-256 with "fleet"
	} {
		k := Digest(tt.hashKey, []byte("Bearer sk-x"), []byte("gpt-4o"))
		if got := hex.EncodeToString(k[:]); got != tt.want {
			t.Errorf("hash key %q: %s, want %s", tt.hashKey, got, tt.want)
		}
	}
	if Digest("", []byte("Bearer sk-xg"), []byte("pt-4o")) == Digest("", []byte("Bearer sk-x"), []byte("gpt-4o")) {
		t.Fatal("parts are not separated")
	}
}

func TestReplyGuard(t *testing.T) {
	for _, tt := range []struct {
		name, stream string
		ok           bool
	}{
		{"simple replies", "+OK\r\n-ERR no\r\n:42\r\n", true},
		{"a bulk and an array", "$5\r\nhe\r\nl\r\n*2\r\n$1\r\na\r\n:1\r\n", true},
		{"nulls", "$-1\r\n*-1\r\n_\r\n", true},
		{"a pub/sub message", "*3\r\n$7\r\nmessage\r\n$8\r\nt:events\r\n$5\r\nc|x|y\r\n", true},
		{"a bulk at the bound", "$1048576\r\n", true},
		{"an array of two billion", "*2000000000\r\n", false},
		{"a bulk of 2 GB", "$2000000000\r\n", false},
		{"a map past the bound", "%600000\r\n", false},
		{"nested arrays past the bound together", strings.Repeat("*1048576\r\n", 2), false},
		{"two top-level arrays each under the bound", "*2\r\n:1\r\n:2\r\n*2\r\n:1\r\n:2\r\n", true},
		{"bulks past the reply's bytes together", "*20\r\n" + strings.Repeat("$1048576\r\n"+strings.Repeat("x", 1<<20)+"\r\n", 17), false},
		{"a length that is no number", "$12x\r\n", false},
		{"not RESP", "HTTP/1.1 200 OK\r\n", false},
		{"a line without end", "+" + strings.Repeat("x", 70<<10), false},
	} {
		for _, split := range []int{1, 3, 1 << 20} { // any split of the stream
			var g replyGuard
			for b := []byte(tt.stream); len(b) > 0 && g.err == nil; {
				n := min(split, len(b))
				g.feed(b[:n])
				b = b[n:]
			}
			if (g.err == nil) != tt.ok {
				t.Errorf("%s, split %d: err %v", tt.name, split, g.err)
			}
		}
	}
}

// hostileRedis accepts connections and answers whatever is sent with an
// array header announcing two billion elements.
func hostileRedis(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					if _, err := c.Write([]byte("*2000000000\r\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "redis://" + ln.Addr().String() + "/0"
}

// TestAHostileRedisCostsNothing: a Redis that answers with a reply
// announcing two billion elements neither holds New (it connects in the
// background) nor grows memory: each call fails at once, as a Redis that
// is down. Before, New subscribed in the foreground without a deadline,
// and go-redis allocated what the reply announced.
func TestAHostileRedisCostsNothing(t *testing.T) {
	url := hostileRedis(t)
	start := time.Now()
	s, err := New(Config{URL: url, Prefix: "t:", Timeout: 200 * time.Millisecond}, zerolog.Nop(), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("New took %v", d)
	}
	for i := 0; i < 3; i++ {
		if _, _, err := s.Reserve("x", 10, 1, 0); err == nil {
			t.Fatal("a reply of two billion elements was taken as an answer")
		}
	}
	time.Sleep(300 * time.Millisecond) // the subscription tried too
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	if m.HeapInuse > 256<<20 {
		t.Fatalf("heap %d MiB after a hostile Redis", m.HeapInuse>>20)
	}
}

// shapelessRedis accepts connections and answers every command but
// HELLO with reply, counting the SUBSCRIBE commands it got.
func shapelessRedis(t *testing.T, reply string, subscribes *atomic.Int32) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					answer, cmd := reply, strings.ToLower(string(buf[:n]))
					switch {
					case strings.Contains(cmd, "hello"): // as Redis 5 answers: go-redis goes on without it
						answer = "-ERR unknown command 'HELLO'\r\n"
					case strings.Contains(cmd, "subscribe"):
						subscribes.Add(1)
					}
					if _, err := c.Write([]byte(answer)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "redis://" + ln.Addr().String() + "/0"
}

// TestAPubSubReplyOfABadShapeIsAFailedCall: a Redis answering the
// subscription with an empty array, a message without its payload, or
// numbers where the kind goes is a failed call: counted, the
// subscription opened anew, the process serving on. Before, go-redis
// indexed the reply unchecked and the panic ended the process within 2 s.
func TestAPubSubReplyOfABadShapeIsAFailedCall(t *testing.T) {
	t.Parallel()
	for _, reply := range []string{"*0\r\n", "*2\r\n$7\r\nmessage\r\n$1\r\nx\r\n", "*2\r\n:1\r\n:9223372036854775807\r\n",
		"*3\r\n$7\r\nmessage\r\n:1\r\n$1\r\nx\r\n", "*3\r\n$9\r\nsubscribe\r\n$1\r\nx\r\n$1\r\nx\r\n"} {
		t.Run(strconv.Quote(reply), func(t *testing.T) {
			t.Parallel()
			var subscribes atomic.Int32
			var errs sync.Map
			s, err := New(Config{URL: shapelessRedis(t, reply, &subscribes), Prefix: "t:", Timeout: 200 * time.Millisecond},
				zerolog.Nop(), Hooks{Error: func(op string) { errs.Store(op, true) }})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for end := time.Now().Add(5 * time.Second); subscribes.Load() < 2; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("subscribed %d times in 5 s: a bad reply did not open the subscription anew", subscribes.Load())
				}
			}
			if _, ok := errs.Load("subscribe"); !ok {
				t.Fatal("the bad reply was not counted as a failed subscribe")
			}
		})
	}
}

// TestAPanicInAFleetGoroutineIsRecovered: a panic in a call the fleet
// makes in the background is logged, counted (Hooks.Panicked) and a
// failed call, and the process goes on.
func TestAPanicInAFleetGoroutineIsRecovered(t *testing.T) {
	t.Parallel()
	panicked := make(chan struct{}, 1)
	var errs sync.Map
	s, err := New(Config{URL: "redis://127.0.0.1:1/0", Prefix: "t:", Timeout: 100 * time.Millisecond}, zerolog.Nop(),
		Hooks{Panicked: func() { panicked <- struct{}{} }, Error: func(op string) { errs.Store(op, true) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.background("publish_cooldown", func(context.Context) error { panic("a test's panic") })
	select {
	case <-panicked:
	case <-time.After(5 * time.Second):
		t.Fatal("the panic was not counted")
	}
	if _, ok := errs.Load("publish_cooldown"); !ok {
		t.Fatal("the panic was not a failed call")
	}
}
