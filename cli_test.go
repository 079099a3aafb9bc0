package main

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheCommandLineRefusesWhatItWouldIgnore: a positional argument is an
// error that names it (flags stop at it, so `sturdy real.yaml -check` used
// to serve the embedded default), -h answers on stdout with exit 0, and a
// flag that does not exist exits 2 with a hint.
func TestTheCommandLineRefusesWhatItWouldIgnore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"real.yaml", "-check"}, 2, "", `unexpected argument "real.yaml"`},
		{[]string{"-check", "-config", "config.example.yaml", "extra"}, 2, "", `unexpected argument "extra"`},
		{[]string{"-h"}, 0, "resilient reverse proxy", ""},
		{[]string{"-help"}, 0, "-healthcheck", ""},
		{[]string{"-nope"}, 2, "", "sturdy -h lists the flags"},
		{[]string{"-nope", "x"}, 2, "", "flag provided but not defined: -nope\nsturdy -h lists the flags\n"},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) ||
			strings.Count(errb.String(), "not defined") > 1 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d, %q, %q", tc.args, code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}

// TestTheHealthcheckFindsTheAdminPortOfTheServingProcess: a container's
// HEALTHCHECK runs `sturdy -healthcheck` without the flags Sturdy was
// started with; it reads them from PID 1's command line when PID 1 is the
// same program, and keeps its own otherwise.
func TestTheHealthcheckFindsTheAdminPortOfTheServingProcess(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			w.WriteHeader(404)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fakeProc := func(exe string, argv ...string) string {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "1"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "1", "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(exe, filepath.Join(dir, "1", "exe")); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	addr := ln.Addr().String()
	served := fakeProc(self, "/sturdy", "-admin-listen", addr)
	for _, tc := range []struct {
		name, proc string
		args       []string
		want       string
	}{
		{"PID 1 is Sturdy", served, []string{"-healthcheck"}, addr},
		{"PID 1 is another program", fakeProc("/bin/sh", "/bin/sh", "-admin-listen", addr), []string{"-healthcheck"}, ""},
		{"its own flag wins", served, []string{"-healthcheck", "-admin-listen", "127.0.0.1:1"}, "127.0.0.1:1"},
		{"no /proc", t.TempDir(), []string{"-healthcheck"}, ""},
	} {
		c, err := parseFlags(tc.args, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if got := servingSettings(c, tc.proc).adminListen; got != tc.want {
			t.Errorf("%s: probes %q, want %q", tc.name, got, tc.want)
		}
	}
	var errb bytes.Buffer
	if code := probeHealth(addr, &errb); code != 0 {
		t.Fatalf("probe of the serving admin port: exit %d: %s", code, errb.String())
	}
	// A file edited into something invalid (the serving Sturdy refused
	// to reload it) does not make the healthcheck fail: only its admin
	// address is read.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("admin: {listen: \""+addr+"\"}\nbogus_key: 1\nupstreams: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"-healthcheck", "-config", bad}, &bytes.Buffer{}, &errb); code != 0 {
		t.Fatalf("-healthcheck with a file that does not validate: exit %d: %s", code, errb.String())
	}
}
