package storage

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func sizeRecord(t *testing.T, s event.Size) *kgo.Record {
	t.Helper()
	if s.V == 0 {
		s.V = event.Version
	}
	b, err := event.Encode(s)
	require.NoError(t, err)
	return &kgo.Record{Key: []byte(s.DatabaseUUID), Value: b, Timestamp: time.UnixMilli(1_000)}
}

func uuidN(n int) string { return fmt.Sprintf("0190a000-0000-7000-8000-%012x", n) }

func TestCollapseKeepsHighestSeqPerDatabase(t *testing.T) {
	recs := []*kgo.Record{
		sizeRecord(t, event.Size{DatabaseUUID: uuidN(2), SizeBytes: 20, Seq: 5, Time: 5_000}),
		sizeRecord(t, event.Size{DatabaseUUID: uuidN(1), SizeBytes: 10, Seq: 7, Time: 3_000}),
		sizeRecord(t, event.Size{DatabaseUUID: uuidN(2), SizeBytes: 21, Seq: 4}), // older: loses, Time from the record
		sizeRecord(t, event.Size{DatabaseUUID: uuidN(1), SizeBytes: 11, Seq: 9}), // newer: wins
		sizeRecord(t, event.Size{DatabaseUUID: uuidN(1), SizeBytes: 12, Seq: 9}), // tie: the first stays, as in the catalog
		sizeRecord(t, event.Size{DatabaseUUID: uuidN(3), SizeBytes: 0, Seq: 0}),
		{Value: []byte("not json")},
		{Value: nil},
		sizeRecord(t, event.Size{V: event.Version + 1, DatabaseUUID: uuidN(4), SizeBytes: 1, Seq: 1}),
		sizeRecord(t, event.Size{DatabaseUUID: strings.ToUpper(uuidN(5)), SizeBytes: 1, Seq: 1}),
		sizeRecord(t, event.Size{DatabaseUUID: uuidN(6), SizeBytes: -1, Seq: 1}),
		sizeRecord(t, event.Size{DatabaseUUID: uuidN(7), SizeBytes: fsm.MaxDatabaseSizeBytes + 1, Seq: 1}),
		sizeRecord(t, event.Size{DatabaseUUID: uuidN(8), SizeBytes: 1, Seq: -1}),
	}
	var reasons []string
	b := collapse(recs, func(_ *kgo.Record, err error) { reasons = append(reasons, err.Error()) })
	assert.Equal(t, []fsm.DatabaseStat{
		{UUID: uuidN(1), SizeBytes: 11, Seq: 9},
		{UUID: uuidN(2), SizeBytes: 20, Seq: 5},
		{UUID: uuidN(3), SizeBytes: 0, Seq: 0},
	}, b.stats, "one per database, sorted by UUID")
	assert.Equal(t, 3, b.superseded)
	assert.Equal(t, 7, b.invalid)
	assert.Len(t, reasons, 7)
	assert.Contains(t, reasons[2], "newer schema version")
	assert.Contains(t, reasons[3], "not canonical lowercase")
	assert.Contains(t, reasons[4], "out of range")
	assert.Contains(t, reasons[6], "negative seq")
	assert.Equal(t, int64(1_000), b.oldestMs, "the record timestamp stands in for a missing measurement time")
}

func TestCanonicalUUIDMatchesTheCatalogsRule(t *testing.T) {
	assert.True(t, canonicalUUID("0190a000-0000-7000-8000-00000000000a"))
	for _, bad := range []string{"", "0190a000-0000-7000-8000-00000000000A", "{0190a000-0000-7000-8000-00000000000}",
		"0190a000000070008000000000000000000a", "0190a000-0000-7000-8000-00000000000g", "0190a000-0000-7000-8000_00000000000a"} {
		assert.False(t, canonicalUUID(bad), bad)
	}
}
