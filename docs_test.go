package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sturdy/config"
	"sturdy/internal/upstreamtest"
)

// docFiles are the README and every page under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	return append([]string{"README.md"}, pages...)
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTheREADMEReadsInTenMinutes: the README is the front door, at most
// 250 lines of at most 120 characters; the rest lives in docs/.
func TestTheREADMEReadsInTenMinutes(t *testing.T) {
	t.Parallel()
	lines := strings.Split(strings.TrimRight(readDoc(t, "README.md"), "\n"), "\n")
	if len(lines) > 250 {
		t.Errorf("README.md has %d lines; at most 250", len(lines))
	}
	for i, l := range lines {
		if n := len([]rune(l)); n > 120 {
			t.Errorf("README.md:%d has %d characters; at most 120", i+1, n)
		}
	}
}

var listItem = regexp.MustCompile(`^([-*]|[0-9]+\.) `)

// paragraphs splits markdown into its units of prose, each with its first
// line number: a paragraph, a list item (with its continuation lines) or a
// table row. Code blocks, table rules and headings are left out.
func paragraphs(text string) (out []string, lines []int) {
	var cur []string
	start, fenced := 0, false
	flush := func() {
		if len(cur) > 0 {
			out, lines = append(out, strings.Join(cur, " ")), append(lines, start)
		}
		cur = nil
	}
	for i, l := range strings.Split(text, "\n") {
		switch trimmed := strings.TrimSpace(l); {
		case strings.HasPrefix(trimmed, "```"):
			fenced = !fenced
			flush()
		case fenced:
		case trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "|---"):
			flush()
		case strings.HasPrefix(trimmed, "|"): // a table row is a unit of its own
			flush()
			out, lines = append(out, trimmed), append(lines, i+1)
		default:
			if listItem.MatchString(trimmed) { // an item starts a unit
				flush()
			}
			if len(cur) == 0 {
				start = i + 1
			}
			cur = append(cur, trimmed)
		}
	}
	flush()
	return out, lines
}

var notWords = regexp.MustCompile(`[^a-z0-9]+`)

// normalise is a paragraph as words: case, punctuation and markup gone.
func normalise(p string) string {
	return strings.TrimSpace(notWords.ReplaceAllString(strings.ToLower(p), " "))
}

// TestNoParagraphIsWrittenTwice: each fact is told in one place across the
// README and docs/; a paragraph that appears twice (case, punctuation and
// markup aside) is a copy that will drift.
func TestNoParagraphIsWrittenTwice(t *testing.T) {
	t.Parallel()
	if got := normalise("**Retries.** `max_attempts`,\n counts"); got != "retries max attempts counts" {
		t.Fatalf("normalise: %q", got)
	}
	if ps, _ := paragraphs("Text:\n- an item\n  goes on\n- another\n\n| a | b |\n|---|---|\n| c | d |\n"); len(ps) != 5 {
		t.Fatalf("paragraphs: %q, want the text, two items and two rows", ps)
	}
	seen := map[string]string{}
	for _, name := range docFiles(t) {
		ps, lines := paragraphs(readDoc(t, name))
		for i, p := range ps {
			n := normalise(p)
			if len(n) < 40 { // a short line ("Python:") may well recur
				continue
			}
			at := fmt.Sprintf("%s:%d", name, lines[i])
			if first, ok := seen[n]; ok {
				t.Errorf("%s repeats the paragraph at %s: %.80q", at, first, p)
				continue
			}
			seen[n] = at
		}
	}
}

var (
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdTitle  = regexp.MustCompile(`(?m)^#+ (.+)$`)
	testFile = regexp.MustCompile("`([a-z0-9_/]+_test\\.go)`")
)

// anchor is GitHub's id for a heading: lower case, punctuation dropped,
// spaces as hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ' || r == '-':
			b.WriteRune('-')
		case r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestTheDocsLinksResolve: every relative link in the README and docs/
// names a file that exists, and an anchor names one of its headings; every
// test file they cite exists.
func TestTheDocsLinksResolve(t *testing.T) {
	t.Parallel()
	if got := anchor("Claude / Anthropic Messages API"); got != "claude--anthropic-messages-api" {
		t.Fatalf("anchor: %q", got)
	}
	for _, name := range docFiles(t) {
		for _, m := range testFile.FindAllStringSubmatch(readDoc(t, name), -1) {
			if _, err := os.Stat(m[1]); err != nil {
				t.Errorf("%s cites %s: %v", name, m[1], err)
			}
		}
		for _, m := range mdLink.FindAllStringSubmatch(readDoc(t, name), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := name
			if file != "" {
				path = filepath.Join(filepath.Dir(name), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s: %v", name, target, err)
				continue
			}
			if frag == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			found := false
			for _, h := range mdTitle.FindAllStringSubmatch(readDoc(t, path), -1) {
				found = found || anchor(h[1]) == frag
			}
			if !found {
				t.Errorf("%s links to %s: %s has no heading #%s", name, target, path, frag)
			}
		}
	}
}

// shellCommands is every command in a page's sh blocks: continuation lines
// joined, comments dropped, `a && b` as two.
func shellCommands(text string) []string {
	var cmds []string
	in := false
	var cont string
	for _, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(l, "```sh"):
			in = true
			continue
		case strings.HasPrefix(l, "```"):
			in = false
			continue
		case !in:
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cont += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		line := cont + l
		cont = ""
		if i := commentAt(line); i >= 0 {
			line = line[:i]
		}
		for _, c := range strings.Split(line, "&&") {
			if c = strings.Join(strings.Fields(c), " "); c != "" {
				cmds = append(cmds, c)
			}
		}
	}
	return cmds
}

// commentAt is where a shell comment starts in line (a # after a space,
// outside quotes), or -1.
func commentAt(line string) int {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && i > 0 && line[i-1] == ' ':
			return i
		}
	}
	return -1
}

// words splits a command as a shell does for the forms the docs use:
// single and double quotes, no expansion.
func words(cmd string) []string {
	var out []string
	var cur strings.Builder
	var quote rune
	inWord := false
	for _, r := range cmd {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ':
			if inWord {
				out, inWord = append(out, cur.String()), false
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

// readmeConfig is the README's production config with its addresses on
// loopback: each URL is replaced by the upstream that stands in for it.
func readmeConfig(t *testing.T, readme string, upstreams map[string]string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "```yaml\n")
	yaml, _, _ := strings.Cut(rest, "```")
	if !ok || !strings.Contains(yaml, "upstreams:") {
		t.Fatal("README.md has no production config (a yaml block)")
	}
	for from, to := range upstreams {
		if !strings.Contains(yaml, from) {
			t.Fatalf("the README's config no longer names %s", from)
		}
		yaml = strings.ReplaceAll(yaml, from, to)
	}
	return yaml
}

// TestTheREADMEsCommandsRun runs every command in the README's and the
// getting-started page's sh blocks, on loopback ports of its own: the
// build, the proxy with no config, the demo and the curls against it, the
// production config's -check and a request through it. What needs a Docker
// engine or a cluster is checked against what it would run (the Dockerfile,
// the manifests, the chart: see each case); go test is CI's first command.
func TestTheREADMEsCommandsRun(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	readme := readDoc(t, "README.md")
	for _, page := range []string{readme, readDoc(t, "docs/getting-started.md")} {
		// Only sh blocks are read: another shell's fence would be commands no test runs.
		if m := regexp.MustCompile("(?m)^\\s*```(bash|shell|console|zsh|shell-session)\\b").FindString(page); m != "" {
			t.Fatalf("a %q block: write it as ```sh, whose commands this test runs", strings.TrimSpace(m))
		}
	}
	cmds := append(shellCommands(readme), shellCommands(readDoc(t, "docs/getting-started.md"))...)
	if len(cmds) < 8 {
		t.Fatalf("found %d commands: %q", len(cmds), cmds)
	}
	dir := t.TempDir()
	const clientKey, adminToken = "client-key-0123456789", "admin-token-0123456789"
	pool1, pool2 := upstreamtest.Start(t, upstreamtest.Step{Body: upstreamtest.ChatCompletion("from the pool")}),
		upstreamtest.Start(t, upstreamtest.Step{Body: upstreamtest.ChatCompletion("from the pool")})
	openai := upstreamtest.Start(t, upstreamtest.Step{Body: upstreamtest.ChatCompletion("from openai")})
	cfg := readmeConfig(t, readme, map[string]string{
		"http://10.0.0.11:8000": pool1.URL, "http://10.0.0.12:8000": pool2.URL, "https://api.openai.com": openai.URL,
	})
	env := append(os.Environ(), "STURDY_CLIENT_KEY="+clientKey, "STURDY_ADMIN_TOKEN="+adminToken, "OPENAI_API_KEY=sk-upstream-0123456789")
	if err := os.WriteFile(filepath.Join(dir, "sturdy.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var demo string // the demo's address, once a command started it
	curls := 0
	for _, cmd := range cmds {
		w := words(cmd)
		background := w[len(w)-1] == "&"
		if background {
			w = w[:len(w)-1]
		}
		switch {
		case cmd == "go build -o sturdy .":
			build := exec.Command("go", "build", "-o", filepath.Join(dir, "sturdy"), ".")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cmd, err, out)
			}
		case cmd == "go test ./...":
			// CI's first command is the same with -race -tags external: every test this one runs, and more.
			if !strings.Contains(readDoc(t, ".ci/run"), "\ngo test -race -count=1 -tags external ./...\n") {
				t.Errorf("%s: .ci/run does not run go test -race -tags external ./...", cmd)
			}
		case w[0] == "./sturdy" && (strings.Contains(cmd, "-check") || strings.Contains(cmd, "-version")):
			run := exec.Command(filepath.Join(dir, "sturdy"), w[1:]...)
			run.Dir, run.Env = dir, env
			if w[len(w)-1] == "config.example.yaml" {
				run.Dir = "."
			}
			if out, err := run.CombinedOutput(); err != nil {
				t.Errorf("%s: %v\n%s", cmd, err, out)
			}
		case w[0] == "./sturdy":
			// It serves on ports of its own (the -listen flags are the test's); background or not, it runs until the test ends.
			p := runBinaryCmd(t, func(bin string, args ...string) *exec.Cmd {
				c := exec.Command(filepath.Join(dir, "sturdy"), args...)
				c.Dir, c.Env = dir, env
				return c
			}, func(listen, admin string) []string {
				return append(append([]string{}, w[1:]...), "-listen", listen, "-admin-listen", admin)
			})
			switch {
			case strings.Contains(cmd, "-demo"):
				demo = p.addr
			case strings.Contains(cmd, "sturdy.yaml"):
				// The production config: a client without the key is refused, one with it is served by the pool.
				if status, _ := post(t, "http://"+p.addr+"/v1/chat/completions", "", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); status != 401 {
					t.Errorf("%s: without the client key: %d, want 401", cmd, status)
				}
				status, body := post(t, "http://"+p.addr+"/v1/chat/completions", clientKey, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
				if status != 200 || !strings.Contains(body, "from the pool") {
					t.Errorf("%s: %d %s", cmd, status, body)
				}
			}
		case w[0] == "curl":
			if demo == "" {
				t.Fatalf("%s: no demo runs before it", cmd)
			}
			var url, data string
			for i := 1; i < len(w); i++ {
				switch {
				case w[i] == "-d":
					i++
					data = w[i]
				case !strings.HasPrefix(w[i], "-"):
					url = w[i]
				}
			}
			url = "http://" + strings.Replace(url, "localhost:8080", demo, 1)
			status, body := post(t, url, "", data)
			curls++
			// A request with empty messages is the client's own mistake, passed through; the others stream an answer.
			want := 200
			if strings.Contains(data, `"messages":[]`) {
				want = 400
			}
			switch {
			case status != want:
				t.Errorf("%s: %d (want %d) %s", cmd, status, want, body)
			case want == 200 && strings.Contains(data, `"stream":true`) && !strings.Contains(body, "data: "):
				t.Errorf("%s: not a stream: %s", cmd, body)
			}
		case w[0] == "docker" && w[1] == "run":
			// No engine here: what the image runs is this binary with the Dockerfile's ENV and the command's -e
			// settings; the image publishes the port the command maps, on the host's loopback.
			df := readDoc(t, "Dockerfile")
			if !strings.Contains(cmd, "-p 127.0.0.1:8080:8080") || !strings.Contains(df, "STURDY_DEFAULT_LISTEN=:8080") ||
				!strings.Contains(df, "EXPOSE 8080") || !strings.HasPrefix(w[len(w)-1], "ghcr.io/sturdy-proxy/sturdy:") {
				t.Errorf("%s: does not match the Dockerfile and the released image's name", cmd)
			}
		case w[0] == "docker" && w[1] == "compose":
			composeFile(t) // TestDeployFilesHoldTogether checks the file
			if w[3] != "deploy/docker-compose.yml" {
				t.Errorf("%s: not deploy/docker-compose.yml", cmd)
			}
		case cmd == "kubectl apply -f deploy/kubernetes.yaml":
			kubernetesExample(t) // parsed, its config checked; TestTheKubernetesSidecarStartsFirstAndStopsLast holds it
		case w[0] == "helm" && w[1] == "install":
			// helm_external_test.go renders the chart with these arguments (TestTheREADMEsHelmCommandsRender).
			if !strings.HasPrefix(w[3], "oci://ghcr.io/sturdy-proxy/charts/sturdy") {
				t.Errorf("%s: not the released chart", cmd)
			}
		default:
			t.Errorf("no test runs %q: add its case here", cmd)
		}
	}
	if curls < 3 {
		t.Errorf("ran %d curls against the demo; the README has two, getting-started one", curls)
	}
}

// post sends body to url (a GET when empty) with key as a bearer token, and
// returns the status and the body read whole (bounded).
func post(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	method := http.MethodPost
	if body == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// TestTheREADMEsConfigIsChecked: the production config the README shows
// passes -check as written, its variables set.
func TestTheREADMEsConfigIsChecked(t *testing.T) {
	t.Parallel()
	yaml := readmeConfig(t, readDoc(t, "README.md"), nil)
	for k, v := range map[string]string{"STURDY_CLIENT_KEY": "client-key-0123456789", "STURDY_ADMIN_TOKEN": "admin-token-0123456789", "OPENAI_API_KEY": "sk-x"} {
		yaml = strings.ReplaceAll(yaml, "${"+k+"}", v)
	}
	if _, err := config.Parse("README.md", []byte(yaml)); err != nil {
		t.Fatal(err)
	}
}
