package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireNode returns the path of node for a suite that runs real D1
// clients in Node (test/compat, test/wrangler), after checking that every
// package in pkgs is installed in dir/node_modules (dir: the suite's folder,
// whose install.sh installs them). Anything missing skips the test with the
// reason, or fails it when SHOAL_REQUIRE_NODE=1 (CI).
func RequireNode(t testing.TB, dir string, pkgs ...string) string {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		hint := "run " + filepath.Join(dir, "install.sh")
		if os.Getenv("SHOAL_REQUIRE_NODE") == "1" {
			t.Fatalf("SHOAL_REQUIRE_NODE=1 but %s (%s)", why, hint)
		}
		t.Skipf("%s (%s; SHOAL_REQUIRE_NODE=1 makes this a failure)", why, hint)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not installed")
	}
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p, "package.json")); err != nil {
			missing(p + " is not installed in " + filepath.Join(dir, "node_modules"))
		}
	}
	return node
}
