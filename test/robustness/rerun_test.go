package robustness

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The report's rerun command names the test, the seed and the knobs the
// run used; a random schedule reruns alone from its own seed.
func TestRerunCommand(t *testing.T) {
	t.Setenv("SHOAL_FAULT", "long")
	t.Setenv("SHOAL_FAULT_KINDS", "packet-loss,throttle")
	t.Setenv("SHOAL_ROBUSTNESS_TLS", "")
	var s schedule
	s.load.Seed = 42
	assert.Equal(t, "SHOAL_ROBUSTNESS_SEED=42 SHOAL_FAULT=long SHOAL_FAULT_KINDS=packet-loss,throttle go test -count=1 -run '^TestFaultLeaderIsolationAndHostKill$' -v ./test/robustness/",
		rerunCommand("TestFaultLeaderIsolationAndHostKill", s))
	s.load.Seed = 45
	assert.Equal(t, "SHOAL_ROBUSTNESS_SEED=45 SHOAL_FAULT=long SHOAL_FAULT_KINDS=packet-loss,throttle SHOAL_FAULT_SCHEDULES=1 go test -count=1 -run '^TestFaultRandomSchedules$' -v ./test/robustness/",
		rerunCommand("TestFaultRandomSchedules/schedule-003-seed-45", s))
}
