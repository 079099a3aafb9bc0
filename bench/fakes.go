package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"sturdy/internal/fakellm"
	"sturdy/internal/otlptest"
)

// replica is one endpoint of a scenario's pool: a fake server of its own.
type replica struct {
	name    string
	profile fakellm.Profile
}

// fakes are the fake model servers behind one load run: the scenario's one
// server, or one per replica (names[i] names servers[i]).
type fakes struct {
	servers []*fakellm.Server
	names   []string
}

// startFakes starts the fake servers of sc: one on listen with the
// scenario's profile, or, for a pool, replica i on listen's port + 1 + i
// (where the peers' replica configs point; port 0 stays 0: any free port).
func startFakes(sc *scenario, s settings, listen string) (fakes, error) {
	var f fakes
	if len(sc.replicas) == 0 {
		srv, err := fakellm.Start(listen, sc.profile(s))
		if err != nil {
			return f, fmt.Errorf("fake server: %w", err)
		}
		return fakes{servers: []*fakellm.Server{srv}, names: []string{"fake"}}, nil
	}
	for i, r := range sc.replicas {
		addr, err := replicaAddr(listen, i)
		if err == nil {
			var srv *fakellm.Server
			if srv, err = fakellm.Start(addr, r.profile); err == nil {
				f.servers, f.names = append(f.servers, srv), append(f.names, r.name)
				continue
			}
		}
		f.close()
		return fakes{}, fmt.Errorf("fake server %s: %w", r.name, err)
	}
	return f, nil
}

// replicaAddr is the address of replica i next to the fake server's
// listen address: its port + 1 + i.
func replicaAddr(listen string, i int) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("port of %q: %w", listen, err)
	}
	if p != 0 {
		p += 1 + i
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// urls lists the servers' URLs, the upstream endpoints of a run.
func (f fakes) urls() []string {
	var out []string
	for _, s := range f.servers {
		out = append(out, s.URL)
	}
	return out
}

// reset restarts every server's outage clock and counters (see
// fakellm.Server.Reset), so a measurement starts clean.
func (f fakes) reset() {
	for _, s := range f.servers {
		s.Reset()
	}
}

// close stops every server.
func (f fakes) close() {
	for _, s := range f.servers {
		s.Close()
	}
}

// stats returns the servers' counters summed, and each server's on its own.
func (f fakes) stats() (sum fakellm.Stats, each []fakellm.Stats) {
	sum.Fates = map[string]int64{}
	for _, s := range f.servers {
		st := s.Stats()
		each = append(each, st)
		addStats(&sum, st)
	}
	return sum, each
}

// addStats adds st's counters to sum's.
func addStats(sum *fakellm.Stats, st fakellm.Stats) {
	if sum.Fates == nil {
		sum.Fates = map[string]int64{}
	}
	sum.Requests += st.Requests
	sum.EarlyRetries += st.EarlyRetries
	sum.InOutage += st.InOutage
	for k, v := range st.Fates {
		sum.Fates[k] += v
	}
}

// shares gives, for a pool, each replica's share of the requests the
// upstream received (share_<name>, %); nothing for a single server.
func (f fakes) shares(sum fakellm.Stats, each []fakellm.Stats) []figure {
	if len(each) < 2 {
		return nil
	}
	var figs []figure
	for i, st := range each {
		figs = append(figs, figure{"share_" + f.names[i], 100 * float64(st.Requests) / float64(max(sum.Requests, 1)), "%"})
	}
	return figs
}

// withServices returns sc ready to run, with the Redis and the OTLP
// collector its fragments name started for it (stop ends them).
func withServices(sc *scenario) (*scenario, func(), error) {
	sc, stopRedis, err := withRedis(sc)
	if err != nil {
		return sc, stopRedis, err
	}
	sc, stopCollector, err := withCollector(sc)
	return sc, func() { stopCollector(); stopRedis() }, err
}

// withCollector returns, for a scenario that exports traces, a copy
// whose fragments name an OTLP/HTTP sink started for it in this process:
// it takes every export and throws it away, so what is measured is
// Sturdy's side of tracing.
func withCollector(sc *scenario) (*scenario, func(), error) {
	if !sc.otlp {
		return sc, func() {}, nil
	}
	rcv, err := otlptest.New(false)
	if err != nil {
		return sc, func() {}, err
	}
	return sc.replacing("OTLP_URL", rcv.URL), rcv.Close, nil
}

// replacing returns a copy of sc with placeholder replaced in its
// fragments and its variants'.
func (sc *scenario) replacing(placeholder, value string) *scenario {
	with := *sc
	with.sturdy = strings.ReplaceAll(sc.sturdy, placeholder, value)
	with.variants = nil
	for _, v := range sc.variants {
		v.sturdy = strings.ReplaceAll(v.sturdy, placeholder, value)
		with.variants = append(with.variants, v)
	}
	return &with
}

// withRedis returns sc ready to run: for a scenario that needs Redis, a
// copy whose fragments name a redis-server started for it (stop ends it).
func withRedis(sc *scenario) (*scenario, func(), error) {
	if !sc.redis {
		return sc, func() {}, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return sc, func() {}, fmt.Errorf("needs redis-server (apt-get install -y redis-server)")
	}
	addr, err := freeAddr()
	if err != nil {
		return sc, func() {}, err
	}
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return sc, func() {}, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			break
		}
		if time.Now().After(end) {
			stop()
			return sc, func() {}, fmt.Errorf("redis-server did not listen on %s", addr)
		}
	}
	with := sc.replacing("REDIS_URL", "redis://"+addr+"/0")
	with.redisAddr = addr
	return with, stop, nil
}

// redisOps is how many commands the redis-server at addr has processed
// ("": none running), less the INFO asking it: a slice's difference is
// what its requests (and the background beats of every Sturdy sharing
// it) cost Redis.
func redisOps(addr string) int64 {
	if addr == "" {
		return 0
	}
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "stats").Result()
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			ops, _ := strconv.ParseInt(v, 10, 64)
			return ops
		}
	}
	return 0
}
