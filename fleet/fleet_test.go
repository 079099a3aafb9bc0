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
	"golang.org/x/time/rate"

	"sturdy/internal/redistest"
)

func start(t *testing.T, url string, hooks Hooks) *State {
	t.Helper()
	s, err := New(Config{URL: url, Prefix: "t:", Timeout: 200 * time.Millisecond, ShareBreakers: true}, zerolog.Nop(), hooks)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// Its first beat (the heartbeat script's first call is two) made, so
	// that a test counting script calls counts its own only: the next is
	// replicaBeat away.
	for end := time.Now().Add(5 * time.Second); s.replicas.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the first heartbeat did not come in 5s")
		}
	}
	return s
}

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

// TestCooldownsReachTheFleet: a cooldown one replica publishes reaches
// another within 100 ms, and one that starts later loads it.
func TestCooldownsReachTheFleet(t *testing.T) {
	r := redistest.Start(t)
	got := make(chan Cooldown, 4)
	start(t, r.URL, Hooks{Cooldown: func(c Cooldown) time.Time { got <- c; return c.Until }})
	a := start(t, r.URL, Hooks{})
	time.Sleep(100 * time.Millisecond) // b subscribed
	c := Cooldown{Upstream: "openai", Key: Digest("", []byte("k"), []byte("m")), Until: time.Now().Add(5 * time.Second), Streak: 2}
	sent := time.Now()
	a.PublishCooldown(c)
	select {
	case g := <-got:
		if g.Upstream != c.Upstream || g.Key != c.Key || g.Until.UnixMilli() != c.Until.UnixMilli() || g.Streak != 2 {
			t.Fatalf("got %+v, want %+v", g, c)
		}
		d := time.Since(sent)
		if d > 100*time.Millisecond {
			t.Fatalf("took %v", d)
		}
		t.Logf("a cooldown reached the other replica in %v", d)
	case <-time.After(time.Second):
		t.Fatal("the cooldown never reached the other replica")
	}
	late := make(chan Cooldown, 4)
	start(t, r.URL, Hooks{Cooldown: func(c Cooldown) time.Time { late <- c; return c.Until }})
	select {
	case g := <-late:
		if g.Key != c.Key {
			t.Fatalf("loaded %+v", g)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a replica that started later did not load the cooldown in force")
	}
}

// TestReserveMatchesTheLocalLimiter: the GCRA script grants and delays
// as rate.Limiter.Reserve does for the same sequence.
func TestReserveMatchesTheLocalLimiter(t *testing.T) {
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	for _, tt := range []struct {
		rate  float64
		burst int
		wait  time.Duration
	}{{10, 1, time.Second}, {10, 5, 200 * time.Millisecond}, {0.5, 2, 0}, {2, 3, 1200 * time.Millisecond}} { // slow enough that the calls take no token's worth of time
		lim := rate.NewLimiter(rate.Limit(tt.rate), tt.burst)
		name := time.Now().String()
		now := time.Now()
		for i := 0; i < 3*tt.burst+3; i++ {
			res := lim.ReserveN(now, 1)
			want := res.DelayFrom(now)
			wantTaken := want <= tt.wait
			if !wantTaken {
				res.CancelAt(now)
			}
			delay, taken, err := s.Reserve(name, tt.rate, tt.burst, tt.wait)
			if err != nil {
				t.Fatal(err)
			}
			elapsed := time.Since(now) // Redis's clock runs on meanwhile
			if taken != wantTaken || delay > want || delay < want-elapsed-time.Millisecond {
				t.Fatalf("rate %v burst %d, reservation %d: taken %v delay %v, local %v %v", tt.rate, tt.burst, i, taken, delay,
					wantTaken, want)
			}
		}
	}
}

// TestRedisDownIsAnErrorWithinTheTimeout: a dead Redis answers no call
// slower than the timeout, is reported down once, and up again once it
// returns.
func TestRedisDownIsAnErrorWithinTheTimeout(t *testing.T) {
	r := redistest.Start(t)
	var mu sync.Mutex
	var ups []bool
	s := start(t, r.URL, Hooks{Up: func(up bool) { mu.Lock(); ups = append(ups, up); mu.Unlock() }})
	if _, _, err := s.Reserve("x", 10, 1, 0); err != nil {
		t.Fatal(err)
	}
	r.Kill()
	for i := 0; i < 5; i++ {
		start := time.Now()
		if _, _, err := s.Reserve("x", 10, 1, 0); err == nil {
			t.Fatal("a dead Redis answered")
		}
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Fatalf("a call waited %v on a dead Redis (timeout 200ms)", d)
		}
	}
	if s.Up() {
		t.Fatal("still up")
	}
	r.Restart()
	deadline := time.Now().Add(3 * time.Second)
	for _, _, err := s.Reserve("x", 10, 1, time.Second); err != nil; _, _, err = s.Reserve("x", 10, 1, time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("never reachable again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ups) != 2 || ups[0] || !ups[1] {
		t.Fatalf("transitions %v, want [false true]", ups)
	}
}

// TestOneSlowReplyDoesNotTurnTheFleetOff: after a call timed out, Redis
// healthy, calls try it again within a second and it is up again.
func TestOneSlowReplyDoesNotTurnTheFleetOff(t *testing.T) {
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	s.result("reserve", context.DeadlineExceeded)
	if s.Up() {
		t.Fatal("a timeout left it up")
	}
	deadline := time.Now().Add(3 * time.Second)
	for !s.Up() {
		if time.Now().After(deadline) {
			t.Fatal("one slow reply turned the fleet off for good")
		}
		if s.Usable() {
			_, _, _ = s.Reserve("probe", 10, 1, 0)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLoadingCooldownsIsPagedAndBounded: a (re)connect reads the
// cooldowns a page at a time and adopts at most MaxCooldowns of them,
// however many Redis holds. Before, every key was read (and adopted)
// at once.
func TestLoadingCooldownsIsPagedAndBounded(t *testing.T) {
	r := redistest.Start(t)
	a := start(t, r.URL, Hooks{})
	until := time.Now().Add(time.Hour)
	pipe := a.rdb.Pipeline()
	for i := 0; i < 2500; i++ {
		k := Digest("", []byte{byte(i), byte(i >> 8)}, []byte("m"))
		pipe.Set(context.Background(), a.cooldownKey("up", k), strconv.FormatInt(until.UnixMilli(), 10)+":0", time.Hour)
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	adopted := 0
	s, err := New(Config{URL: r.URL, Prefix: "t:", Timeout: 200 * time.Millisecond, MaxCooldowns: 1000}, zerolog.Nop(),
		Hooks{Cooldown: func(c Cooldown) time.Time {
			mu.Lock()
			adopted++
			mu.Unlock()
			return c.Until
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if adopted != 1000 {
		t.Fatalf("%d cooldowns adopted of 2,500 in Redis, want the bound 1,000", adopted)
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
