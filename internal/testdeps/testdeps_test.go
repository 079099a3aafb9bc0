package testdeps

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAMissingDependencyFails runs a test that needs a program no
// machine has, in a child process (t.Fatal ends the goroutine that calls
// it): it fails, naming the install command, whether CI is set or not.
func TestAMissingDependencyFails(t *testing.T) {
	if os.Getenv("TESTDEPS_CHILD") != "" {
		Binary(t, "no-such-program-sturdy", "apt-get install -y no-such-program")
		t.Fatal("Binary returned for a missing program")
	}
	t.Parallel()
	for _, ci := range []string{"", "true"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAMissingDependencyFails$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTDEPS_CHILD=1", "CI="+ci)
		out, err := cmd.CombinedOutput()
		if err == nil || strings.Contains(string(out), "--- SKIP") || !strings.Contains(string(out), "apt-get install -y no-such-program") {
			t.Errorf("CI=%q: err %v, output:\n%s", ci, err, out)
		}
	}
}
