package test

import (
	"os"
	"testing"

	"github.com/shoaldb/shoal/test/harness"
)

// shoalBin is the shoal binary the tests of this package run as real
// processes, built once per test process (harness.Binary).
var shoalBin harness.Binary

func TestMain(m *testing.M) {
	code := m.Run()
	shoalBin.Remove()
	os.Exit(code)
}
