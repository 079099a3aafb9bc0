package proxy

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"sturdy/policy"
	"sturdy/upstream"

	"github.com/tidwall/gjson"
)

// TestREADMEErrorTableIsTheVocabulary checks the README's table of error
// codes row for row against errorTable: same codes, statuses and words.
func TestREADMEErrorTableIsTheVocabulary(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "| code | status | Anthropic `error.type` | SDK may retry | when |\n|---|---|---|---|---|\n")
	if !ok {
		t.Fatal("README has no error-code table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	var want []string
	for _, s := range errorTable {
		status := "—"
		if s.status != 0 {
			status = strconv.Itoa(s.status)
		}
		retry := "no"
		switch {
		case s.status == 0:
			retry = "—" // sent inside a stream
		case s.sdkRetries:
			retry = "yes"
		}
		want = append(want, "| `"+s.code+"` | "+status+" | `"+s.anthropic+"` | "+retry+" | "+s.when+" |")
	}
	got := strings.Split(strings.TrimSpace(table), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("README's error table:\n%s\n\nerrorTable says:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestEveryErrorCodeHasOneRow(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, s := range errorTable {
		if seen[s.code] || s.message == "" || s.when == "" || (s.status != 0 && (s.status < 400 || s.status > 599)) {
			t.Errorf("bad row %+v", s)
		}
		seen[s.code] = true
	}
	for _, code := range []string{CodeBadRequest, CodeHeadersTooLarge, CodeRequestTooLarge, CodeRouteNotFound, CodeInvalidAPIKey,
		CodeRateLimited, CodeCircuitOpen, CodeUpstreamBusy, CodeUpstreamUnreachable, CodeRetriesExhausted, CodeUpstreamTimeout,
		CodeDeadlineExceeded, CodeShuttingDown, CodeStreamInterrupted} {
		if specOf(code).code != code {
			t.Errorf("%s has no row", code)
		}
	}
}

// TestREADMELimitsTableNamesTheBounds: the Limits table says each bound
// as the code has it.
func TestREADMELimitsTableNamesTheBounds(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, limits, ok := strings.Cut(string(readme), "\n## Limits\n")
	limits, _, _ = strings.Cut(limits, "\n## ")
	if !ok {
		t.Fatal("README has no Limits section")
	}
	for _, row := range []struct{ limit, says string }{
		{"request line + headers", sizeText(DefaultMaxHeaderBytes)},
		{"request body", sizeText(DefaultMaxBody)},
		{"open client connections", fmt.Sprintf("less %d", reservedFDs)},
		{"open client connections", fmt.Sprintf("at most %d answered", maxRefusing)},
		{"riders waiting out an outage", fmt.Sprintf("%d,%03d", upstream.DefaultRideThroughQueue/1000, upstream.DefaultRideThroughQueue%1000)},
		{"framing held before a stream's commit point", sizeText(maxHold)},
		{"rescue text", sizeText(DefaultMaxRescueBytes)},
		{"a body read whole for an HTTP/1.0 client", sizeText(maxWholeBody)},
		{"held stream heads, rescue text and HTTP/1.0 bodies", sizeText(DefaultMaxBufferedBytes)},
		{"request bodies held", sizeText(DefaultMaxRequestBytes)},
		{"how deep a request's text is followed", fmt.Sprintf("%d levels", policy.MaxTextDepth)},
		{"upstream response headers", sizeText(upstream.ReadBuffer) + "; " + fmt.Sprint(upstream.MaxInterimResponses) + "; " + sizeText(upstream.MaxTrailerBytes)},
		{"a model name as kept and shown", fmt.Sprintf("%d bytes", policy.MaxModelBytes)},
		{"reply breakers per endpoint", fmt.Sprintf("; %d |", upstream.MaxListedModelBreakers)},
		{"cooldowns per upstream", fmt.Sprintf("%d,%03d", upstream.MaxTrackedKeys/1000, upstream.MaxTrackedKeys%1000)},
		{"retries / targets listed", fmt.Sprintf("%d / %d; %d", maxLoggedRetries, maxLoggedTargets, maxTriedEndpoints)},
		{"a span's value copied from a request", sizeText(maxSpanText)},
		{"admin connections", fmt.Sprintf("%d;", AdminConnections)},
		{"one learned cooldown", fmt.Sprintf("%d min", int(upstream.DefaultCooldownMax.Minutes()))},
	} {
		line := ""
		for _, l := range strings.Split(limits, "\n") {
			if strings.HasPrefix(l, "| "+row.limit) {
				line = l
			}
		}
		if line == "" || !strings.Contains(line, row.says) {
			t.Errorf("Limits row %q does not say %q: %q", row.limit, row.says, line)
		}
	}
}

// TestEveryAPIHasAnErrorShape: every API's row renders a body an SDK of
// that API parses (error.code, error.type) and an SSE error event.
func TestEveryAPIHasAnErrorShape(t *testing.T) {
	t.Parallel()
	e := newError(CodeRetriesExhausted, 3, "up", "503")
	for _, tt := range []struct {
		api   policy.API
		event string // the SSE event's first line
		// code and typ are where the body says the code, and its type
		code, typ, wantType string
	}{
		{policy.APIOther, "data: {", "error.code", "error.type", ErrorType},
		{policy.APIChat, "data: {", "error.code", "error.type", ErrorType},
		{policy.APICompletions, "data: {", "error.code", "error.type", ErrorType},
		{policy.APIResponses, "event: error", "error.code", "error.type", ErrorType},
		{policy.APIOllama, "data: {", "error.code", "error.type", ErrorType},
		{policy.APIAnthropic, "event: error", "sturdy.code", "error.type", "api_error"},
	} {
		sh := shapeOf(tt.api)
		if b := gjson.ParseBytes(sh.body(e, []byte("req-1"))); b.Get(tt.code).Str != CodeRetriesExhausted || b.Get(tt.typ).Str != tt.wantType {
			t.Errorf("%v: body %s", tt.api, sh.body(e, nil))
		}
		ev := string(sh.event(nil, e, 7))
		if !strings.HasPrefix(ev, tt.event) || !strings.HasSuffix(ev, "\n\n") || !strings.Contains(ev, CodeRetriesExhausted) {
			t.Errorf("%v: event %q", tt.api, ev)
		}
	}
	if got := string(shapeOf(policy.APIResponses).event(nil, e, 7)); !strings.Contains(got, `"sequence_number":7`) {
		t.Errorf("the Responses event lacks its sequence number: %s", got)
	}
	a := gjson.ParseBytes(shapeOf(policy.APIAnthropic).body(e, []byte("req-1")))
	if a.Get("type").Str != "error" || a.Get("request_id").Str != "req-1" || a.Get("error.message").Str != e.msg {
		t.Errorf("the Anthropic body: %s", a.Raw)
	}
	for _, s := range errorTable {
		if s.anthropic == "" {
			t.Errorf("%s has no Anthropic error type", s.code)
		}
	}
}
