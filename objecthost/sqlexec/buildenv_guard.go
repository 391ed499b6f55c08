//go:build !(sqlite_trace && sqlite_preupdate_hook && sqlite_fts5 && sqlite_math_functions && sqlite_omit_load_extension)

// This file is compiled only when build.env's build tags are missing: a
// plain `go build ./...` or `go test ./...` in a shell that has not loaded
// build.env, or an editor without the tags. Such a build links SQLite
// without the functions sqlexec calls (they exist only with these tags and
// build.env's CGO_CFLAGS) and ends in pages of linker errors. The function
// below has no body and links to a symbol named for the fix, so the first
// of those errors says what to do:
//
//	undefined reference to `Shoal_builds_need_build_env__run__set_a_and_dot_build_env_and_set_plus_a__…'
//
// It fails at link time on purpose: `go vet ./...` and editors only
// type-check, and keep working without the tags. Keep the tags above equal
// to the -tags in build.env's GOFLAGS.

package sqlexec

import _ "unsafe" // go:linkname

//go:linkname buildEnvMissing Shoal_builds_need_build_env__run__set_a_and_dot_build_env_and_set_plus_a__in_the_repository_root_or_use_make
func buildEnvMissing()

func init() { buildEnvMissing() }
