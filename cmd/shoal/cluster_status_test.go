package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/shoaldb/shoal/raftmeta"
)

// TestPrintStatusShowsLevels: the cluster's catalog level in the header
// (1 when the asked node predates levels and reports none) and each
// reachable member's build level (1 for a member that reports none).
func TestPrintStatusShowsLevels(t *testing.T) {
	st := raftmeta.ClusterStatus{Leader: "n1", Term: 3, ClusterLevel: 2, Self: raftmeta.SelfStatus{ID: "n1", State: "Leader"},
		Members: []raftmeta.Member{
			{ID: "n1", Suffrage: "Voter", Reachable: true, Leader: true, State: "Leader", BuildLevel: 2},
			{ID: "n2", Suffrage: "Nonvoter", Reachable: true, State: "Follower", BuildLevel: 0, LastContactMs: 5},
			{ID: "n3", Suffrage: "Voter"},
		}}
	var out bytes.Buffer
	printStatus(&out, st)
	lines := strings.Split(out.String(), "\n")
	assert.Contains(t, lines[0], "catalog level: 2")
	assert.True(t, strings.HasSuffix(strings.TrimSpace(lines[2]), "BUILD LEVEL"), lines[2])
	assert.True(t, strings.HasSuffix(strings.TrimSpace(lines[3]), " 2"), lines[3])
	assert.True(t, strings.HasSuffix(strings.TrimSpace(lines[4]), " 1"), lines[4])
	assert.True(t, strings.HasSuffix(strings.TrimSpace(lines[5]), " -"), lines[5])

	st.ClusterLevel = 0
	out.Reset()
	printStatus(&out, st)
	assert.Contains(t, out.String(), "catalog level: 1")
}
