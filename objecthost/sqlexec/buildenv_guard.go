//go:build !(sqlite_trace && sqlite_preupdate_hook && sqlite_fts5 && sqlite_math_functions && sqlite_omit_load_extension)

// This file is compiled only when build.env's build tags are missing: a
// plain `go build ./...`, `go test ./...` or `go vet ./...` in a shell that
// has not loaded build.env, or an editor without the tags. Without it such a
// build compiles SQLite for a minute and ends in pages of linker errors
// (sqlexec calls SQLite functions that exist only with these tags and
// build.env's CGO_CFLAGS). Instead, the go command fails while loading
// packages, before compiling anything, on the embed pattern below (it names
// no file), and prints it as one line:
//
//	objecthost/sqlexec/buildenv_guard.go:NN:12: pattern Shoal builds need build.env: run "set -a && . ./build.env && set +a" … : no matching files found
//
// An invalid import path would read better but is reported even when the
// file is excluded, so it cannot be used. Keep the tags above equal to the
// -tags in build.env's GOFLAGS. CGO_CFLAGS cannot be checked here: with the
// tags but without -DSQLITE_ENABLE_STMT_SCANSTATUS the link still fails.

package sqlexec

import _ "embed"

//go:embed `Shoal builds need build.env: run "set -a && . ./build.env && set +a" in the repository root, or use make`
var buildEnvMissing string
