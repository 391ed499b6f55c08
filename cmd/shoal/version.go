package main

import (
	"runtime/debug"
	"strings"
)

// Set at link time by the Makefile (`make build`, `make install`):
//
//	-ldflags "-X main.version=$(git describe --tags --always --dirty) -X main.commit=$(git rev-parse HEAD)"
//
// They are the fallback for builds without Go's VCS stamp: build.env sets
// -buildvcs=false, and Go does not stamp builds from a git worktree (its
// .git is a file). Empty means not set.
var (
	version string
	commit  string
)

// buildVersion is what `shoal --version` prints after "shoal version ".
func buildVersion() string {
	info, _ := debug.ReadBuildInfo()
	return formatVersion(version, commit, info)
}

// formatVersion combines the link-time variables with the build info Go
// embeds (nil when there is none). The commit, its time and whether the tree
// had local changes come from the build info's vcs.* settings when present
// (they describe the binary exactly), else from the link-time commit. The
// version is the link-time `git describe` when set, else the module version
// Go recorded (a tag, `go install …@v1.2.3`, or since Go 1.24 a pseudo-version
// from the VCS stamp), else the short commit, else "dev".
//
//	v0.3.0-2-g8d64250-dirty (commit 8d64250…, 2026-12-02T03:09:00Z, modified)
//	dev
func formatVersion(ldVersion, ldCommit string, info *debug.BuildInfo) string {
	v, rev := versionAndCommit(ldVersion, ldCommit, info)
	if rev == "" {
		return v
	}
	var when string
	modified := false
	if info != nil {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	details := []string{"commit " + rev}
	if when != "" {
		details = append(details, when)
	}
	if modified {
		details = append(details, "modified")
	}
	return v + " (" + strings.Join(details, ", ") + ")"
}

// versionAndCommit are formatVersion's version and commit (the commit is
// empty when unknown); shoal_build_info carries them as labels.
func versionAndCommit(ldVersion, ldCommit string, info *debug.BuildInfo) (string, string) {
	var rev string
	modified := false
	if info != nil {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if rev == "" {
		rev = ldCommit
	}

	v := ldVersion
	if v == "" && info != nil && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	if v == "" && rev != "" {
		v = rev[:min(len(rev), 12)]
		if modified {
			v += "-dirty"
		}
	}
	if v == "" {
		v = "dev"
	}
	return v, rev
}
