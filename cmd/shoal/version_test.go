package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFormatVersion(t *testing.T) {
	const rev = "8d64250aa1b2c3d4e5f60718293a4b5c6d7e8f90"
	vcs := func(modified string) *debug.BuildInfo {
		return &debug.BuildInfo{
			Main: debug.Module{Path: "github.com/shoaldb/shoal", Version: "(devel)"},
			Settings: []debug.BuildSetting{
				{Key: "-tags", Value: "sqlite_trace"},
				{Key: "vcs", Value: "git"},
				{Key: "vcs.revision", Value: rev},
				{Key: "vcs.time", Value: "2026-12-02T03:09:00Z"},
				{Key: "vcs.modified", Value: modified},
			},
		}
	}
	noVCS := &debug.BuildInfo{Main: debug.Module{Path: "github.com/shoaldb/shoal", Version: "(devel)"}}

	for _, tc := range []struct {
		name             string
		ldVersion, ldRev string
		info             *debug.BuildInfo
		want             string
	}{
		{"go build in a checkout: Go 1.24+ stamps a pseudo-version", "", "", func() *debug.BuildInfo {
			i := vcs("true")
			i.Main.Version = "v0.0.0-20261202030900-8d64250aa1b2+dirty"
			return i
		}(), "v0.0.0-20261202030900-8d64250aa1b2+dirty (commit " + rev + ", 2026-12-02T03:09:00Z, modified)"},
		{"go build without a module version", "", "", vcs("false"),
			"8d64250aa1b2 (commit " + rev + ", 2026-12-02T03:09:00Z)"},
		{"go build without a module version, local changes", "", "", vcs("true"),
			"8d64250aa1b2-dirty (commit " + rev + ", 2026-12-02T03:09:00Z, modified)"},
		{"make build in a checkout: describe names the version, the stamp the commit", "v0.3.0-2-g8d64250", "ignored", vcs("false"),
			"v0.3.0-2-g8d64250 (commit " + rev + ", 2026-12-02T03:09:00Z)"},
		{"make build without a VCS stamp (build.env's -buildvcs=false, a worktree)", "8d64250-dirty", rev, noVCS,
			"8d64250-dirty (commit " + rev + ")"},
		{"link-time version only", "v0.3.0", "", noVCS, "v0.3.0"},
		{"go install module@version", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}}, "v0.3.0"},
		{"no build info at all", "", "", nil, "dev"},
		{"build info without VCS or version", "", "", noVCS, "dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, formatVersion(tc.ldVersion, tc.ldRev, tc.info))
		})
	}
}

// The flag users type prints the same string, after cobra's "shoal version ".
func TestVersionFlag(t *testing.T) {
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"--version"})
	require.NoError(t, root.Execute())
	assert.Equal(t, "shoal version "+buildVersion()+"\n", out.String())
}

// objecthost/sqlexec/buildenv_guard.go makes a build without build.env's tags
// fail its link on a symbol naming build.env (README, "Building with the go
// command"). Its constraint must list every tag build.env sets: each one
// missing brings the file in, all present leave it out.
func TestBuildEnvGuard(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	env, err := os.ReadFile("../../build.env")
	require.NoError(t, err)
	m := regexp.MustCompile(`-tags=([^\s"]+)`).FindSubmatch(env)
	require.NotNil(t, m, "build.env sets no -tags in GOFLAGS")
	tags := strings.Split(string(m[1]), ",")

	// Whether the guard file is part of the package: it must be exactly
	// when a tag is missing (it then fails the link, naming build.env).
	guarded := func(tags []string) bool {
		cmd := exec.Command(gobin, "list", "-f", "{{.GoFiles}}", "./objecthost/sqlexec")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false -tags="+strings.Join(tags, ","))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.Contains(string(out), "buildenv_guard.go")
	}
	assert.False(t, guarded(tags), "with build.env's tags the guard must not be built")
	for i := range tags {
		without := append(append([]string{}, tags[:i]...), tags[i+1:]...)
		assert.True(t, guarded(without), "without tag %s", tags[i])
	}
}
