package proxy

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestREADMEErrorTableIsTheVocabulary checks the README's table of error
// codes row for row against errorTable: same codes, statuses and words.
func TestREADMEErrorTableIsTheVocabulary(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "| code | status | when |\n|---|---|---|\n")
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
		want = append(want, "| `"+s.code+"` | "+status+" | "+s.when+" |")
	}
	got := strings.Split(strings.TrimSpace(table), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("README's error table:\n%s\n\nerrorTable says:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestEveryErrorCodeHasOneRow(t *testing.T) {
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
