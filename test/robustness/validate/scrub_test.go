package validate

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/test/robustness/topology"
)

// ArchiveDamageReported: a host must report exactly the hit databases whose
// archive shows the loss, with the same ranges, healed, alarmed; nothing
// else.
func TestArchiveDamageReported(t *testing.T) {
	lost := []topology.LostObject{
		{Key: topology.ArchivePrefix + "db1/0000000000000001/seg/0000000000000003-0000000000000004-0000000000000009.seg", How: "delete"},
		{Key: topology.ArchivePrefix + "db2/0000000000000001/snap/0000000000000005-0000000000000009.snap", How: "delete"},
	}
	lr := history.LostRange{Gen: "0000000000000001", FirstTxid: 3, LastTxid: 9,
		After: history.Position{Gen: "0000000000000001", Txid: 2, TimeUs: 5}, Until: history.Position{Gen: "0000000000000001", Txid: 10, TimeUs: 20}}
	own := map[string]history.ScrubReport{
		"db1": {Lost: []history.LostRange{lr}, Current: true},
		"db2": {Current: true}, // a redundant snapshot: nothing lost, nothing seen
	}
	live := map[string]string{"db1": "h1", "db2": "h1"}
	report := func(dbs ...string) topology.ScrubStatus {
		st := topology.ScrubStatus{DamagedN: len(dbs)}
		for _, db := range dbs {
			d := topology.ArchiveDamage{Database: db, HealedAt: string(history.MakeBookmark(db, lr.Until))}
			d.Lost = append(d.Lost, struct {
				Gen       string `json:"gen"`
				FirstTxid uint64 `json:"first_txid"`
				LastTxid  uint64 `json:"last_txid"`
				After     string `json:"after_bookmark"`
				Until     string `json:"until_bookmark"`
			}{lr.Gen, lr.FirstTxid, lr.LastTxid, string(history.MakeBookmark(db, lr.After)), string(history.MakeBookmark(db, lr.Until))})
			st.Damaged = append(st.Damaged, d)
		}
		return st
	}
	good := []HostScrub{{Host: "h1", Status: report("db1"), Alarm: true, AlarmDBs: 1, CLI: true}, {Host: "h2"}}
	r := ArchiveDamageReported(lost, good, own, live)
	assert.True(t, r.OK(), "%v", r.Violations)
	assert.Equal(t, 2, r.Checked)

	unreported := []HostScrub{{Host: "h1"}, {Host: "h2"}}
	assert.Len(t, ArchiveDamageReported(lost, unreported, own, live).Violations, 1, "a hit that shows, not reported")

	falseReport := []HostScrub{{Host: "h1", Status: report("db1"), Alarm: true, AlarmDBs: 1, CLI: true}, {Host: "h2", Status: report("db3"), Alarm: true, AlarmDBs: 1, CLI: true}}
	assert.Len(t, ArchiveDamageReported(lost, falseReport, own, live).Violations, 1, "a database the store lost nothing of")

	noAlarm := []HostScrub{{Host: "h1", Status: report("db1"), CLI: true}}
	assert.Len(t, ArchiveDamageReported(lost, noAlarm, own, live).Violations, 1, "reported without the alarm")

	noCLI := []HostScrub{{Host: "h1", Status: report("db1"), Alarm: true, AlarmDBs: 1}}
	assert.Len(t, ArchiveDamageReported(lost, noCLI, own, live).Violations, 1, "not in shoal cluster status")

	other := own["db1"]
	other.Lost = []history.LostRange{{Gen: lr.Gen, FirstTxid: 3, LastTxid: 12, After: lr.After, Until: history.Position{Gen: lr.Gen, Txid: 13}}}
	assert.Len(t, ArchiveDamageReported(lost, good, map[string]history.ScrubReport{"db1": other, "db2": own["db2"]}, live).Violations, 1, "other ranges")

	unhealed := own["db1"]
	unhealed.Current = false
	assert.Len(t, ArchiveDamageReported(lost, good, map[string]history.ScrubReport{"db1": unhealed, "db2": own["db2"]}, live).Violations, 1, "not healed")

	assert.True(t, ArchiveDamageReported(nil, []HostScrub{{Host: "h1"}}, nil, live).OK(), "nothing lost, nothing reported")
}

func TestNameTxid(t *testing.T) {
	n, ok := nameTxid("0000000000000003-00000000000000a4-0000000000000009.seg")
	assert.True(t, ok)
	assert.Equal(t, uint64(0xa4), n)
	n, ok = nameTxid("00000000000000b5-0000000000000009.snap")
	assert.True(t, ok)
	assert.Equal(t, uint64(0xb5), n)
	_, ok = nameTxid("tip")
	assert.False(t, ok)
}
