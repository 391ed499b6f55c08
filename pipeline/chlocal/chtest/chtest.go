// Package chtest gives a test package one clickhouse-server (chlocal) shared
// by its tests, each using a database of its own:
//
//	func TestMain(m *testing.M) { chtest.Main(m) }
//	…
//	ch := chtest.Require(t) // skips without clickhouse-server, fails with SHOAL_REQUIRE_CLICKHOUSE=1
//
// Tests that stop or kill ClickHouse start their own server with chlocal.
package chtest

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/shoaldb/shoal/pipeline/chlocal"
)

var (
	shared    *chlocal.Server
	sharedErr error
)

// Main starts the shared server (in a temporary data dir), runs the tests,
// stops the server and exits with the tests' status.
func Main(m *testing.M) {
	dir, err := os.MkdirTemp("", "shoal-test-ch-")
	if err != nil {
		panic(err)
	}
	shared, sharedErr = chlocal.Start(context.Background(), chlocal.Config{DataDir: dir})
	code := m.Run()
	if shared != nil {
		_ = shared.Close()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// Require returns the shared server. A missing clickhouse-server skips the
// test unless SHOAL_REQUIRE_CLICKHOUSE=1 (CI), which fails it, as does any
// other start failure.
func Require(t testing.TB) *chlocal.Server {
	t.Helper()
	if sharedErr != nil {
		if errors.Is(sharedErr, chlocal.ErrNotInstalled) && os.Getenv("SHOAL_REQUIRE_CLICKHOUSE") != "1" {
			t.Skipf("clickhouse-server not installed (scripts/deps.sh installs it): %v", sharedErr)
		}
		t.Fatalf("clickhouse-server: %v", sharedErr)
	}
	if shared == nil {
		t.Fatal("chtest.Require without chtest.Main in the package's TestMain")
	}
	return shared
}
