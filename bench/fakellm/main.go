// Command fakellm runs the fake OpenAI-compatible model server with a
// fault profile, for load tests and for trying Sturdy without a model:
//
//	go run ./bench/fakellm -listen 127.0.0.1:18000 -p503 0.1 -p429 0.05 -retry-after 1s
//	go run ./bench/fakellm -profile faults.yaml
//
// The profile YAML has the keys of fakellm.Profile (seed, status: {429: 0.1},
// retry_after, reset, hang, cut, cut_after, stall, ttft: {base, jitter},
// inter_token, tokens, outage: {from, to}, models: [demo]); flags set on top
// of it win.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.yaml.in/yaml/v3"

	"sturdy/internal/fakellm"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18000", "address to serve on")
	profileFile := flag.String("profile", "", "fault profile YAML")
	seed := flag.Uint64("seed", 1, "seed of the fault sequence")
	statuses := map[int]*float64{}
	for _, code := range []int{429, 500, 502, 503, 504} {
		statuses[code] = flag.Float64(fmt.Sprintf("p%d", code), 0, fmt.Sprintf("probability of a %d", code))
	}
	reset := flag.Float64("reset", 0, "probability of a connection reset before headers")
	hang := flag.Float64("hang", 0, "probability of a silent upstream")
	cut := flag.Float64("cut", 0, "probability of a stream cut after -cut-after chunks")
	cutAfter := flag.Int("cut-after", 3, "chunks before a cut")
	retryAfter := flag.Duration("retry-after", 0, "Retry-After sent with 429/503")
	ttft := flag.Duration("ttft", 0, "time to first token")
	itl := flag.Duration("itl", 0, "time between tokens")
	tokens := flag.Int("tokens", 16, "content chunks per reply")
	flag.Parse()

	p, err := readProfile(*profileFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if p.Status == nil {
		p.Status = map[int]float64{}
	}
	for code, v := range statuses {
		if set[fmt.Sprintf("p%d", code)] {
			p.Status[code] = *v
		}
	}
	apply := func(name string, f func()) {
		if set[name] || *profileFile == "" {
			f()
		}
	}
	apply("seed", func() { p.Seed = *seed })
	apply("reset", func() { p.Reset = *reset })
	apply("hang", func() { p.Hang = *hang })
	apply("cut", func() { p.Cut, p.CutAfter = *cut, *cutAfter })
	apply("retry-after", func() { p.RetryAfter = *retryAfter })
	apply("ttft", func() { p.TTFT.Base = *ttft })
	apply("itl", func() { p.InterToken.Base = *itl })
	apply("tokens", func() { p.Tokens = *tokens })

	s, err := fakellm.Start(*listen, *p)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Fprintf(os.Stderr, "fakellm on %s (counters at %s/_stats)\n", s.URL, s.URL)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	s.Close()
	st := s.Stats()
	fmt.Fprintf(os.Stderr, "served %d requests: %v (early retries %d)\n", st.Requests, st.Fates, st.EarlyRetries)
}

// readProfile reads a fault profile from a YAML file (unknown keys are
// errors); an empty name is the empty profile.
func readProfile(name string) (*fakellm.Profile, error) {
	var p fakellm.Profile
	if name == "" {
		return &p, nil
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	return &p, nil
}
