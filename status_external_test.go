//go:build external

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"sturdy/internal/testdeps"
	"sturdy/internal/upstreamtest"
)

// TestTheStatusPageShowsABreakerOpeningAndNoSecret drives the admin
// listener's status page in a real headless Chromium: with admin.token set
// the page asks for the token once and keeps it in sessionStorage (never
// in the URL); it shows the upstream, its endpoint and a model's breaker
// opening within a second of it opening, the failed requests with their
// decision trail, fits a phone's width, and shows neither the token nor
// the upstream's key.
func TestTheStatusPageShowsABreakerOpeningAndNoSecret(t *testing.T) {
	t.Parallel()
	chromium := testdeps.Binary(t, "chromium", "apt-get install -y chromium")
	const (
		token     = "status-page-token-0123456789"
		upstreamK = "sk-upstream-secret-0123456789"
	)
	failing := upstreamtest.Start(t, upstreamtest.Step{Status: 500, Header: [][2]string{upstreamtest.JSONHeader}, Body: `{"error":{"message":"boom"}}`})
	cfgPath := filepath.Join(t.TempDir(), "sturdy.yaml")
	cfg := `admin: {token: ` + token + `}
upstreams:
  - name: flaky
    url: ` + failing.URL + `
    api_key: ` + upstreamK + `
    breaker: {consecutive_failures: 2, open_for: 60s}
routes:
  - name: default
    upstream: flaky
    retry: {max_attempts: 1}
`
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var admin string
	p := runBinary(t, func(listen, adminAddr string) []string {
		admin = adminAddr
		return []string{"-config", cfgPath, "-listen", listen, "-admin-listen", adminAddr}
	})

	alloc, cancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()), chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true))
	defer cancel()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	page := "http://" + admin + "/status"
	if err := chromedp.Do(ctx, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	// Polled with Evaluate: chromedp's WaitVisible misses an element that
	// a script shows after load.
	waitFor := func(what, js string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the page never showed %s", what)
			}
		}
	}
	waitFor("the token form", `getComputedStyle(document.getElementById("login")).display !== "none"`)
	// Typed as a user would, and sent with the button (a script's
	// form.submit() would skip the page's submit handler).
	if err := chromedp.Do(ctx, chromedp.SendKeys("#token", token)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`document.querySelector("#login button").click()`)); err != nil {
		t.Fatal(err)
	}
	waitFor("the upstream", `document.querySelector("#upstreams .card") !== null`)
	text, err := chromedp.Run(ctx, chromedp.Text("#upstreams"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "flaky") || !strings.Contains(text, "breaker closed") {
		t.Fatalf("the page shows:\n%s", text)
	}

	// Two 500s open the model's breaker; the page must show it within a
	// second of /debug/upstreams saying so.
	for range 2 {
		resp, err := http.Post("http://"+p.addr+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	opened := waitModelBreakerOpen(t, admin, token)
	var shown bool
	for time.Since(opened) < 3*time.Second && !shown {
		if shown, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`[...document.querySelectorAll("#upstreams td .state")].some((e) => e.textContent === "open")`)); err != nil {
			t.Fatal(err)
		}
		if !shown {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if took := time.Since(opened); !shown || took > time.Second {
		t.Fatalf("the open breaker showed %v (%v after it opened), want within a second", shown, took)
	}

	waitFor("a failed request", `document.querySelector("#failures tbody tr") !== null`)
	// Readable on a phone: at 375 px wide the page does not scroll
	// sideways (wide tables scroll inside their own box).
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(375, 740)); err != nil {
		t.Fatal(err)
	}
	waitFor("itself within a phone's width", `document.documentElement.scrollWidth <= window.innerWidth`)
	read := func(a chromedp.Action[string]) string {
		t.Helper()
		v, err := chromedp.Run(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	failures, html, location := read(chromedp.Text("#failures")), read(chromedp.OuterHTML("html")), read(chromedp.Location())
	stored := read(chromedp.Evaluate[string](`sessionStorage.getItem("sturdy-admin-token")`))
	for _, want := range []string{"exhausted", "flaky @" + strings.TrimPrefix(failing.URL, "http://") + ": 1× → 5xx", "stop: max_attempts", "POST /v1/chat/completions"} {
		if !strings.Contains(failures, want) {
			t.Errorf("the failed requests lack %q:\n%s", want, failures)
		}
	}
	if stored != token || strings.Contains(location, token) || location != page {
		t.Errorf("the token is kept in sessionStorage (%q) and not in the URL (%s)", stored, location)
	}
	for _, secret := range []string{token, upstreamK} {
		if strings.Contains(html, secret) {
			t.Errorf("the page shows a secret (%.6s…)", secret)
		}
	}
}

// waitModelBreakerOpen polls /debug/upstreams until a model breaker is
// open and returns when it saw it.
func waitModelBreakerOpen(t *testing.T, admin, token string) time.Time {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+admin+"/debug/upstreams", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Upstreams []struct {
				ModelBreakers []struct {
					State string `json:"state"`
				} `json:"model_breakers"`
			} `json:"upstreams"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range st.Upstreams {
			for _, b := range u.ModelBreakers {
				if b.State == "open" {
					return time.Now()
				}
			}
		}
	}
	t.Fatal("no model breaker opened")
	return time.Time{}
}
