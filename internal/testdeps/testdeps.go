// Package testdeps is the one rule for what a test needs from outside
// Go's module cache (redis-server, node and the npm packages of e2e/node,
// later a browser or helm): .ci/run installs it, a test never does. When
// it is missing, a test fails when CI is set (CI must have it) and
// otherwise skips, naming the command that installs it.
package testdeps

import (
	"os"
	"os/exec"
	"testing"
)

// Missing fails or skips t, by the rule above, for what is missing and
// the command that installs it.
func Missing(t testing.TB, what, install string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is missing (CI is set, so it must be there): %s", what, install)
	}
	t.Skipf("%s is missing; install it with: %s", what, install)
}

// Binary returns the path of the program name, or fails or skips t by
// the rule above.
func Binary(t testing.TB, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Missing(t, name, install)
	}
	return path
}

// File makes sure path exists (an installed package, say), or fails or
// skips t by the rule above.
func File(t testing.TB, path, what, install string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(t, what, install)
	}
}
