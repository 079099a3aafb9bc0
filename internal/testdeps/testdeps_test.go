package testdeps

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAMissingDependencySkipsOutsideCIAndFailsInIt runs a test that needs
// a program no machine has, once without CI and once with it, in a child
// process (t.Skip and t.Fatal end the goroutine that calls them).
func TestAMissingDependencySkipsOutsideCIAndFailsInIt(t *testing.T) {
	if os.Getenv("TESTDEPS_CHILD") != "" {
		Binary(t, "no-such-program-sturdy", "apt-get install -y no-such-program")
		t.Fatal("Binary returned for a missing program")
	}
	t.Parallel()
	for _, tc := range []struct {
		ci      string
		failed  bool
		message string
	}{
		{"", false, "--- SKIP"},
		{"true", true, "CI is set"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAMissingDependencySkipsOutsideCIAndFailsInIt$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTDEPS_CHILD=1", "CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.failed || !strings.Contains(string(out), tc.message) || !strings.Contains(string(out), "apt-get install -y no-such-program") {
			t.Errorf("CI=%q: err %v, output:\n%s", tc.ci, err, out)
		}
	}
}
