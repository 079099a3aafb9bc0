// Package testdeps is the one rule for what a test needs from outside
// Go's module cache (redis-server, node and the npm packages of e2e/node,
// helm, chromium): only tests built with the external tag use it
// (go test -tags external), .ci/run installs what they need, and a test
// never does. When it is missing, the test fails, naming the command
// that installs it: nothing is skipped where nobody would see it.
package testdeps

import (
	"os"
	"os/exec"
	"testing"
)

// Missing fails t for what is missing, naming the command that installs
// it.
func Missing(t testing.TB, what, install string) {
	t.Helper()
	t.Fatalf("%s is missing (a test built with -tags external needs it): %s", what, install)
}

// Binary returns the path of the program name, or fails t (Missing).
func Binary(t testing.TB, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Missing(t, name, install)
	}
	return path
}

// File makes sure path exists (an installed package, say), or fails t
// (Missing).
func File(t testing.TB, path, what, install string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(t, what, install)
	}
}
