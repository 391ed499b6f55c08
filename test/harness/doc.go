// Package harness is what the multi-process tests share: the shoal binary
// built once per test process, shoal children in their own process groups,
// loopback listeners, the v4 API client, the in-process e2e cluster and the
// background-plane cluster of processes, and the load and metrics helpers
// the figures print with.
//
// It exists because helpers in _test.go files cannot be imported: package
// test (integration, end-to-end and fault tests) and package test/bench (the
// benchmark harnesses behind `make bench`) both use it. Every function that
// takes a testing.TB fails that test on a broken precondition and must be
// called from the test's goroutine; the ones that return an error instead
// (Try, GetJSON, RaftmetaReads) may be called from any goroutine.
package harness
