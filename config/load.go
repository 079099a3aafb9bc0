package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// DefaultAdminListen is the admin listener's default address.
const DefaultAdminListen = "127.0.0.1:9090"

// DefaultUpstreamURL is where Sturdy forwards with no config: Ollama's
// default address.
const DefaultUpstreamURL = "http://127.0.0.1:11434"

// Problem is one thing wrong with a config file.
type Problem struct {
	// Line is the 1-based line of the offending key or value; 0 if unknown.
	Line int
	// Key is the dotted path of the key, e.g. "routes[0].retry.max_attempts".
	Key string
	// Msg says what is wrong.
	Msg string
	// syntax marks yaml's own words about a document it cannot parse:
	// they quote YAML's tokens, never a value (redact leaves them be).
	syntax bool
	// File names the file the problem is in when it is not the config
	// file itself (client_keys_file).
	File string
}

// Error is an invalid config: every problem found, in line order.
type Error struct {
	// File names the config source in messages.
	File     string
	Problems []Problem
}

// secretKeys are the key names whose values are secrets: a message about
// one never quotes the value. Add every new secret-bearing key here.
var secretKeys = regexp.MustCompile(`(^|\.)(api_key|api_key_file|auth|keys|redis_url|password|hash_key|headers|token|secret)(\[|\.|$)`)

// quoted matches a value a message quotes: "…", `…` (yaml's) or '…'.
var quoted = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|`[^`]*`|'[^']*'")

// secretLike matches what looks like a credential wherever it is quoted:
// an OpenAI-style key, a bearer token, a URL's user:password@.
var secretLike = regexp.MustCompile(`sk-[A-Za-z0-9_\-.]+|(?i:bearer)\s+\S+|://[^/\s@"'` + "`" + `]+@|[?&][^=&\s"'` + "`" + `]+=[^&\s"'` + "`" + `]*`)

// redact keeps secrets out of a problem's message: every quoted value of
// a secret-bearing key, and anything that looks like a credential.
func redact(p Problem) string {
	msg := p.Msg
	// A message that names no key may be about any value, a secret's too:
	// what it quotes is left out.
	if (p.Key == "" || secretKeys.MatchString(p.Key)) && !p.syntax {
		msg = quoted.ReplaceAllString(msg, `"[redacted]"`)
	}
	return secretLike.ReplaceAllStringFunc(msg, func(m string) string {
		switch {
		case strings.HasPrefix(m, "://"):
			return "://[redacted]@"
		case m[0] == '?' || m[0] == '&': // a URL's query parameter
			k, _, _ := strings.Cut(m, "=")
			return k + "=[redacted]"
		}
		return "[redacted]"
	})
}

// Error formats one problem per line as "file:line: key: message", with
// secrets redacted (see redact).
func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		if p.File != "" {
			b.WriteString(p.File)
		} else {
			b.WriteString(e.File)
		}
		if p.Line > 0 {
			b.WriteString(":" + strconv.Itoa(p.Line))
		}
		b.WriteString(": ")
		if p.Key != "" {
			b.WriteString(p.Key + ": ")
		}
		b.WriteString(redact(p))
	}
	return b.String()
}

// Default returns the configuration used without a file: listen on :8080
// and forward everything to one upstream at url (DefaultUpstreamURL when
// empty).
func Default(url string) *Config {
	if url == "" {
		url = DefaultUpstreamURL
	}
	c := defaultConfig()
	c.Upstreams = []Upstream{{Name: DefaultUpstreamName, URL: url}}
	c.applyImplicitRoute()
	return c
}

// Load reads and validates the config file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes and validates a config document; name labels messages.
// Unknown keys, bad values and invalid settings are all reported at once,
// each with its key and line.
func Parse(name string, data []byte) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, &Error{File: name, Problems: syntaxProblems(err, data)}
	}
	// A key written twice is one problem, at the second; the decode goes on
	// without it, so the rest is validated as if it were not there.
	problems := dropDuplicateKeys(&root, "")
	problems = append(problems, moreDocuments(data)...)
	idx := newKeyIndex(&root)
	problems = append(problems, schemaProblems(&root, reflect.TypeFor[Config]())...)
	c := defaultConfig()
	if len(root.Content) > 0 {
		if err := root.Content[0].Decode(c); err != nil {
			problems = append(problems, yamlProblems(err, idx)...)
		}
	}
	// Validate what did decode too, so one bad value does not hide the
	// rest; a key already reported is not reported again.
	reported := map[string]bool{}
	for _, p := range problems {
		reported[p.Key] = true
	}
	c.written = idx.lines
	problems = append(problems, c.adminAlias()...)
	c.expandEnv()
	c.applyImplicitRoute()
	problems = append(problems, c.readSecretFiles(idx)...)
	keyProblems := c.readClientKeys(idx)
	covered := func(key string) bool {
		for k := range reported {
			if key == k || strings.HasPrefix(key, k+".") || strings.HasPrefix(key, k+"[") {
				return true
			}
		}
		return false
	}
	for _, p := range c.Validate() {
		if !covered(p.Key) {
			p.Line = idx.line(p.Key)
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 || len(keyProblems) > 0 {
		sort.SliceStable(problems, func(i, j int) bool { return problems[i].Line < problems[j].Line })
		return nil, &Error{File: name, Problems: append(problems, keyProblems...)}
	}
	return c, nil
}

// defaultConfig holds the defaults that are config's own: the listen
// addresses and logging. Every other default belongs to the package that
// uses the value (proxy, policy, breaker): a key left out stays zero here.
// DefaultUpstreamName names the embedded default's one upstream — not
// "default", the implicit route's name, so a message tells them apart.
const DefaultUpstreamName = "model-server"

func defaultConfig() *Config {
	return &Config{Listen: ":8080", AdminListen: DefaultAdminListen, Log: Log{Level: "info", Format: "json"}}
}

// written reports whether key (a dotted path such as
// "routes[0].retry.max_attempts") was written in the file: a written
// value is validated as written, even zero, while a key left out takes
// its default.
func (c *Config) isWritten(key string) bool {
	_, ok := c.written[key]
	return ok
}

// Written reports whether the file set key (a dotted path, e.g.
// "admin_listen"), as opposed to leaving it to its default; the admin
// listener's address is written under either of its names.
func (c *Config) Written(key string) bool {
	if key == "admin_listen" || key == "admin.listen" {
		return c.isWritten("admin_listen") || c.isWritten("admin.listen")
	}
	return c.isWritten(key)
}

// Line returns the line the file sets key on (a dotted path), 0 when it
// does not: for a problem found outside Validate, where the environment
// takes part (tracing).
func (c *Config) Line(key string) int { return c.written[key] }

// adminAlias makes admin.listen the admin listener's address (its alias
// admin_listen holds it from here on); both written is a problem.
func (c *Config) adminAlias() []Problem {
	if !c.isWritten("admin.listen") {
		return nil
	}
	if c.isWritten("admin_listen") {
		return []Problem{{Key: "admin.listen", Line: c.written["admin.listen"],
			Msg: "set admin.listen or the top-level admin_listen (its alias), not both"}}
	}
	c.AdminListen = c.Admin.Listen
	return nil
}

func (c *Config) applyImplicitRoute() {
	if len(c.Routes) == 0 && len(c.Upstreams) == 1 {
		c.Routes = []Route{{Name: "default", Upstream: c.Upstreams[0].Name}}
	}
}

// readSecretFiles loads api_key_file, admin.token_file,
// shared_state.password_file and auth.keys_file, so secrets can live
// outside the YAML.
func (c *Config) readSecretFiles(idx *keyIndex) []Problem {
	var ps []Problem
	bad := func(key, format string, args ...any) {
		ps = append(ps, Problem{Key: key, Line: idx.line(key), Msg: fmt.Sprintf(format, args...)})
	}
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		readSecret(bad, fmt.Sprintf("upstreams[%d].api_key_file", i), "api_key", u.APIKeyFile, &u.APIKey, false)
	}
	readSecret(bad, "admin.token_file", "token", c.Admin.TokenFile, &c.Admin.Token, false)
	if s := c.SharedState; s != nil {
		readSecret(bad, "shared_state.password_file", "password", s.PasswordFile, &s.Password, true)
	}
	if f := c.Auth.KeysFile; f != "" {
		b, err := readBounded(f, MaxClientKeysFileBytes)
		if err != nil {
			bad("auth.keys_file", "%v", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				c.Auth.Keys = append(c.Auth.Keys, line)
			}
		}
	}
	return ps
}

// readSecret sets *value from file (key names the file's setting, inline
// the setting it stands for): one of the two, the file readable, its
// trimmed content not empty unless mayBeEmpty. No file: nothing to do.
func readSecret(bad func(key, format string, args ...any), key, inline, file string, value *string, mayBeEmpty bool) {
	if file == "" {
		return
	}
	if *value != "" {
		bad(key, "set %s or %s, not both", inline, key[strings.LastIndexByte(key, '.')+1:])
		return
	}
	b, err := readBounded(file, MaxSecretFileBytes)
	if err != nil {
		bad(key, "%v", err)
		return
	}
	if *value = strings.TrimSpace(string(b)); *value == "" && !mayBeEmpty {
		bad(key, "%q is empty", file)
	}
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandEnv replaces ${VAR} in listen, in each upstream's url, endpoints
// and api_key, in shared_state's redis_url, password and hash_key, and in
// tracing's endpoint and header values with the environment's value
// (empty when unset).
func (c *Config) expandEnv() {
	x := func(key, v string) string { return c.expand(key, v) }
	c.Listen = x("listen", c.Listen)
	c.AdminListen = x("admin.listen", c.AdminListen)
	c.Admin.Token = x("admin.token", c.Admin.Token)
	for i := range c.Auth.Keys {
		c.Auth.Keys[i] = x(fmt.Sprintf("auth.keys[%d]", i), c.Auth.Keys[i])
	}
	if s := c.SharedState; s != nil {
		s.RedisURL = x("shared_state.redis_url", s.RedisURL)
		s.Password, s.HashKey = x("shared_state.password", s.Password), x("shared_state.hash_key", s.HashKey)
	}
	c.Tracing.Endpoint = x("tracing.endpoint", c.Tracing.Endpoint)
	for k, v := range c.Tracing.Headers {
		c.Tracing.Headers[k] = x("tracing.headers."+k, v)
	}
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		k := fmt.Sprintf("upstreams[%d].", i)
		u.URL = x(k+"url", u.URL)
		for j, e := range u.Endpoints {
			u.Endpoints[j] = x(fmt.Sprintf("%sendpoints[%d]", k, j), e)
		}
		u.APIKey = x(k+"api_key", u.APIKey)
	}
}

// expand replaces each ${VAR} in s, the value of key, with the
// variable's value, noting a variable unset or empty (unsetVars): never
// its value, only its name and what the key's emptiness will do.
func (c *Config) expand(key, s string) string {
	return envRef.ReplaceAllStringFunc(s, func(m string) string {
		name := m[2 : len(m)-1]
		v, set := os.LookupEnv(name)
		if v == "" {
			state := "unset"
			if set {
				state = "empty"
			}
			c.unsetVars = append(c.unsetVars, Problem{Key: key, Line: c.written[key],
				Msg: fmt.Sprintf("${%s} is %s, so this is empty: %s", name, state, emptyMeans(key, c.authOn()))})
		}
		return v
	})
}

// authOn is whether clients authenticate with Sturdy's own keys: their
// credentials are then Sturdy's, and never go upstream. auth.keys are
// expanded before the upstreams' keys, which ask.
func (c *Config) authOn() bool { return len(c.Auth.Keys) > 0 || c.Auth.KeysFile != "" }

// emptyMeans says what an empty key leads to; authOn, whether clients
// authenticate with Sturdy's own keys.
func emptyMeans(key string, authOn bool) string {
	switch {
	case strings.HasSuffix(key, ".api_key") && authOn:
		return "Sturdy sends no key of its own, and with auth.keys on no client's credential goes upstream either (a provider answers 401)"
	case strings.HasSuffix(key, ".api_key"):
		return "Sturdy sends no key of its own, and each client's own credential goes upstream (a provider answers 401 to a dummy one)"
	case key == "admin.token":
		return "the admin endpoints need no token"
	case strings.HasPrefix(key, "auth.keys"):
		return "that client key is empty"
	case key == "shared_state.password":
		return "Redis is asked without a password"
	case key == "shared_state.hash_key":
		return "credentials are keyed by SHA-256, not HMAC"
	}
	return "the setting takes its empty value"
}

// expand replaces each ${VAR} in s with the variable's value (unset:
// empty), for what is read without a Config.
func expand(s string) string {
	return envRef.ReplaceAllStringFunc(s, func(m string) string { return os.Getenv(m[2 : len(m)-1]) })
}

// AdminListenOf is the admin listener's address the config file data
// writes — admin.listen, else its alias admin_listen, ${VAR} expanded as
// Parse does — or "" when it writes none or is not YAML. It reads that
// key alone and checks nothing: for the health probe, which must not fail
// on a file the server would refuse.
func AdminListenOf(data []byte) string {
	var f struct {
		AdminListen string `yaml:"admin_listen"`
		Admin       struct {
			Listen string `yaml:"listen"`
		} `yaml:"admin"`
	}
	if yaml.Unmarshal(data, &f) != nil {
		return ""
	}
	if f.Admin.Listen != "" {
		return expand(f.Admin.Listen)
	}
	return expand(f.AdminListen)
}

// yamlLine matches yaml's "line N: msg" and typeError's "line N:C: msg".
var yamlLine = regexp.MustCompile(`^line (\d+)(?::(\d+))?: (.*)$`)

// yamlProblems turns a yaml error into problems, naming the key found on
// each reported line when idx knows it.
// syntaxProblems reports a document YAML cannot parse, with the key path
// nearest to where it stopped (keyPathAt). A tab in the indentation is
// reported on the line that has it (yaml names the line before). yaml's
// parser errors ("did not find expected …") count lines from 0, where
// its scanner's count from 1: those (zeroBased) are moved down one, to
// the line of the construct left unfinished.
func syntaxProblems(err error, data []byte) []Problem {
	ps := yamlProblems(err, nil)
	if len(ps) == 1 && strings.Contains(ps[0].Msg, "tab character") {
		for i, line := range strings.Split(string(data), "\n") {
			if indent := line[:len(line)-len(strings.TrimLeft(line, " \t"))]; strings.Contains(indent, "\t") {
				return []Problem{{Line: i + 1, Msg: "a tab in the indentation: YAML indents with spaces"}}
			}
		}
	}
	last := lastWrittenLine(data)
	for i := range ps {
		ps[i].syntax = true
		if ps[i].Line > 0 && zeroBased.MatchString(ps[i].Msg) {
			ps[i].Line++
		}
		if ps[i].Line > last {
			ps[i].Line = last
		}
		if ps[i].Line > 0 {
			ps[i].Key = keyPathAt(data, ps[i].Line)
		}
	}
	return ps
}

// moreDocuments reports a second YAML document (after ---) in one file:
// only the first is read, so what follows would be silently ignored —
// a syntax error in it too.
func moreDocuments(data []byte) []Problem {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var n yaml.Node
	if dec.Decode(&n) != nil {
		return nil // the first one's problems are reported already
	}
	for {
		var next yaml.Node
		switch err := dec.Decode(&next); {
		case err == io.EOF:
			return nil
		case err != nil:
			return []Problem{{Msg: "a second YAML document (after ---) does not parse, and would not be read: one document per file"}}
		case len(next.Content) > 0 && !isNull(next.Content[0]): // an empty one (a trailing ---) says nothing
			return []Problem{{Line: next.Line, Msg: "a second YAML document (after ---) is not read: one document per file"}}
		}
	}
}

// isNull says whether n is YAML's null written as nothing.
func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null" && n.Value == ""
}

// lastWrittenLine is the number of the last line that is not blank.
func lastWrittenLine(data []byte) int {
	lines := strings.Split(string(data), "\n")
	for n := len(lines); n > 0; n-- {
		if strings.TrimSpace(lines[n-1]) != "" {
			return n
		}
	}
	return 0
}

// zeroBased matches the parser errors whose line yaml counts from 0.
var zeroBased = regexp.MustCompile(`^did not find expected (key|node content|'-' indicator|',' or '[\]}]')`)

// blockKey matches a block mapping's key at the start of a (trimmed) line.
var blockKey = regexp.MustCompile(`^("[^"]*"|'[^']*'|[^\s:#'"\[\]{}][^:#]*?)\s*:(\s|$)`)

// keyPathAt is the dotted path of the last key written at or before line
// of a document YAML cannot parse, read from the indentation alone (the
// way a reader finds it): upstreams[0].timeouts. Empty when no key
// precedes it.
func keyPathAt(data []byte, line int) string {
	type level struct {
		indent int
		key    string // empty for a sequence item
		item   int
	}
	var stack []level
	for n, text := range strings.Split(string(data), "\n") {
		if n >= line {
			break
		}
		rest := strings.TrimLeft(text, " ")
		indent := len(text) - len(rest)
		if rest == "" || rest[0] == '#' {
			continue
		}
		for strings.HasPrefix(rest, "- ") || rest == "-" {
			for len(stack) > 0 && stack[len(stack)-1].indent > indent {
				stack = stack[:len(stack)-1]
			}
			item := 0
			if top := len(stack) - 1; top >= 0 && stack[top].key == "" && stack[top].indent == indent {
				item = stack[top].item + 1
				stack = stack[:top]
			}
			stack = append(stack, level{indent: indent, item: item})
			rest = strings.TrimLeft(strings.TrimPrefix(rest, "-"), " ")
			indent = len(text) - len(rest)
		}
		m := blockKey.FindStringSubmatch(rest)
		if m == nil {
			continue
		}
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		stack = append(stack, level{indent: indent, key: strings.Trim(m[1], `"'`)})
	}
	path := ""
	for _, l := range stack {
		if l.key == "" {
			path += "[" + strconv.Itoa(l.item) + "]"
		} else {
			path = joinKey(path, l.key)
		}
	}
	return path
}

// dropDuplicateKeys removes every mapping key written a second time (and
// its value) under n, reporting each once, at the line of the second.
func dropDuplicateKeys(n *yaml.Node, path string) []Problem {
	var ps []Problem
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			ps = append(ps, dropDuplicateKeys(c, path)...)
		}
	case yaml.MappingNode:
		first := map[string]int{}
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := joinKey(path, k.Value)
			if line, dup := first[k.Value]; dup {
				ps = append(ps, Problem{Line: k.Line, Key: key, Msg: fmt.Sprintf("written twice (first at line %d): keep one", line)})
				continue
			}
			first[k.Value] = k.Line
			ps = append(ps, dropDuplicateKeys(v, key)...)
			kept = append(kept, k, v)
		}
		n.Content = kept
	case yaml.SequenceNode:
		for i, c := range n.Content {
			ps = append(ps, dropDuplicateKeys(c, path+"["+strconv.Itoa(i)+"]")...)
		}
	}
	return ps
}

// unmarshalMsg matches yaml's type errors, to say them in plain words.
var unmarshalMsg = regexp.MustCompile("^cannot unmarshal !!(\\w+)(?: `(.*)`)? into (.+)$")

// plainWords turns yaml's "cannot unmarshal !!str `lots` into int" into
// `want an integer, got "lots"`.
func plainWords(msg string) string {
	m := unmarshalMsg.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	got := strconv.Quote(m[2])
	switch m[1] {
	case "seq":
		got = "a list"
	case "map":
		got = "a mapping (key: value)"
	case "int", "float", "bool":
		got = m[2]
	}
	want := "a " + m[3]
	switch t := m[3]; {
	case t == "time.Duration":
		want = "a duration (e.g. 250ms, 2s, 1m30s)"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		want = "an integer"
	case strings.HasPrefix(t, "float"):
		want = "a number"
	case t == "bool":
		want = "true or false"
	case t == "string":
		want = "a string"
	case strings.HasPrefix(t, "[]"):
		want = "a list"
	case strings.HasPrefix(t, "map["), strings.HasPrefix(t, "config."):
		want = "a mapping (key: value)"
	}
	return "want " + want + ", got " + got
}

func yamlProblems(err error, idx *keyIndex) []Problem {
	var te *yaml.TypeError
	var msgs []string
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	var out []Problem
	for _, m := range msgs {
		p := Problem{Msg: m}
		if s := yamlLine.FindStringSubmatch(m); s != nil {
			p.Line, _ = strconv.Atoi(s[1])
			col, _ := strconv.Atoi(s[2])
			p.Msg = plainWords(s[3])
			if idx != nil {
				p.Key = idx.keyAt(p.Line, col)
			}
		}
		out = append(out, p)
	}
	return out
}

// keyIndex maps dotted key paths to their lines, and back.
type keyIndex struct {
	lines  map[string]int
	keys   map[int]string    // first key seen on each line
	values map[[2]int]string // key of the value at (line, column)
}

func newKeyIndex(root *yaml.Node) *keyIndex {
	idx := &keyIndex{lines: map[string]int{}, keys: map[int]string{}, values: map[[2]int]string{}}
	if len(root.Content) > 0 {
		idx.walk(root.Content[0], "")
	}
	return idx
}

func (idx *keyIndex) add(path string, line int) {
	idx.lines[path] = line
	if _, ok := idx.keys[line]; !ok {
		idx.keys[line] = path
	}
}

func (idx *keyIndex) walk(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := joinKey(path, n.Content[i].Value)
			idx.add(p, n.Content[i].Line)
			v := n.Content[i+1]
			idx.values[[2]int{v.Line, v.Column}] = p
			idx.walk(v, p)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			idx.add(p, item.Line)
			idx.values[[2]int{item.Line, item.Column}] = p
			idx.walk(item, p)
		}
	}
}

// line returns the line of path, or of its closest present parent (a
// missing required key is reported where its parent is).
func (idx *keyIndex) line(path string) int {
	for path != "" {
		if l, ok := idx.lines[path]; ok {
			return l
		}
		cut := strings.LastIndexAny(path, ".[")
		if cut < 0 {
			break
		}
		path = path[:cut]
	}
	return 0
}

// keyAt returns the key whose value starts at line:col, or else the first
// key on the line.
func (idx *keyIndex) keyAt(line, col int) string {
	if k, ok := idx.values[[2]int{line, col}]; ok {
		return k
	}
	return idx.keys[line]
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// schemaProblems walks the document against the Go type it decodes into
// and reports every mapping key that has no field, listing the known
// ones, and every value for a time.Duration that is not one (durations
// are declared as time.Duration where their package declares its config:
// package upstream). Such a value is read here, as time.ParseDuration
// reads it — 0 as well as 2s; "30" has no unit — and left for yaml to
// decode as that string (yaml refuses a bare number; a null is left to
// mean unset); a bad one is replaced, once reported, so the decode
// reports it no second time. A negative count for an unsigned field
// (breaker's) is read as 0, which validation refuses with its key.
func schemaProblems(root *yaml.Node, t reflect.Type) []Problem {
	if len(root.Content) == 0 {
		return nil
	}
	var out []Problem
	var walk func(n *yaml.Node, t reflect.Type, path string)
	walk = func(n *yaml.Node, t reflect.Type, path string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if n.Kind == yaml.AliasNode && n.Alias != nil && n.Alias.Kind == yaml.ScalarNode {
			n = n.Alias // an alias of a value is checked as the value (never followed further: no cycles)
		}
		scalar := n.Kind == yaml.ScalarNode && n.Tag != "!!null"
		switch {
		case scalar && t == reflect.TypeFor[time.Duration]():
			if msg := durationProblem(n.Value); msg != "" {
				out = append(out, Problem{Line: n.Line, Key: path, Msg: msg})
				n.Value = "0s"
			}
			n.Value, n.Tag = strings.TrimSpace(n.Value), "!!str"
		case scalar && t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64 && !reflect.PointerTo(t).Implements(unmarshaler) &&
			strings.HasPrefix(strings.TrimSpace(n.Value), "-"):
			// yaml's own error would name no key: read as 0, which
			// Validate refuses with the key (every such count is at least 1).
			n.Value = "0"
		case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
			fields := yamlFields(t)
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				p := joinKey(path, k.Value)
				ft, ok := fields[k.Value]
				if !ok {
					out = append(out, Problem{Line: k.Line, Key: p,
						Msg: "unknown key (known: " + strings.Join(sortedKeys(fields), ", ") + ")"})
					continue
				}
				walk(n.Content[i+1], ft, p)
			}
		case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
			for i, item := range n.Content {
				walk(item, t.Elem(), path+"["+strconv.Itoa(i)+"]")
			}
		}
	}
	walk(root.Content[0], t, "")
	return out
}

// unmarshaler is the interface of a type that decodes itself.
var unmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// durationProblem says what is wrong with v as a duration ("": nothing),
// in the words of units.Duration's decoding.
func durationProblem(v string) string {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	switch {
	case err != nil:
		return fmt.Sprintf("invalid duration %q (want e.g. 250ms, 2s, 1m30s)", v)
	case d < 0:
		return fmt.Sprintf("duration %q must not be negative", v)
	}
	return ""
}

func yamlFields(t reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" && f.Type.Kind() == reflect.Struct {
			maps.Copy(m, yamlFields(f.Type)) // an inlined struct's keys are its holder's
			continue
		}
		if name != "" && name != "-" {
			m[name] = f.Type
		}
	}
	return m
}

func sortedKeys(m map[string]reflect.Type) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// WriteProblems prints err for a person: one problem per line.
func WriteProblems(w io.Writer, err error) {
	var ce *Error
	if errors.As(err, &ce) {
		fmt.Fprintln(w, ce.Error())
		return
	}
	fmt.Fprintln(w, err)
}
