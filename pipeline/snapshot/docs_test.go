package snapshot

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// The "Storage snapshotter" section of pipeline/DESIGN.md states the
// table, the defaults and the metrics; they are checked against the code.
func TestDesignDocMatchesCode(t *testing.T) {
	raw, err := os.ReadFile("../DESIGN.md")
	require.NoError(t, err)
	doc := string(raw)
	i := strings.Index(doc, "## Storage snapshotter (`pipeline/snapshot`)")
	require.GreaterOrEqual(t, i, 0, "pipeline/DESIGN.md has no Storage snapshotter section")
	sec := doc[i:]
	if j := strings.Index(sec[3:], "\n## "); j >= 0 {
		sec = sec[:j+3]
	}
	ws := regexp.MustCompile(`\s+`)
	flat := ws.ReplaceAllString(sec, " ")

	// The DDL: every column with its type, the engine and keys.
	ddl := SchemaDDL("shoal")[1]
	assert.Contains(t, flat, "CREATE TABLE shoal."+Table+" (")
	cols := regexp.MustCompile(`(?m)^\s+(\w+)\s+(\w+),?$`).FindAllStringSubmatch(ddl, -1)
	require.Len(t, cols, 11)
	for _, m := range cols {
		assert.Regexp(t, regexp.MustCompile(`\b`+m[1]+`\s+`+m[2]+`\b`), sec, "column %s", m[1])
		assert.Contains(t, columns, m[1], "insert column list")
	}
	for _, line := range []string{"ENGINE = ReplacingMergeTree()", "PARTITION BY toYYYYMM(day)",
		"ORDER BY (kind, account_id, snapshot_time, pass_id, database_uuid)"} {
		assert.Contains(t, ddl, line)
		assert.Contains(t, flat, line)
	}

	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer conn.Close()
	s, err := New(Config{Catalog: stubCatalog{}, Conn: conn})
	require.NoError(t, err)
	defer s.Close()
	for _, claim := range []struct {
		text string
		ok   bool
	}{
		{"`Interval` (default 1 h)", s.cfg.Interval == time.Hour},
		{"(`PageSize` 10,000)", s.cfg.PageSize == 10_000},
		{"`limit` 1..10,000 (default 1,000)", fsm.MaxStoragePage == 10_000 && fsm.DefaultStoragePage == 1_000},
		{"`BatchRows` (50,000)", s.cfg.BatchRows == 50_000},
		{"(100 ms doubling to 5 s, each attempt bounded by `AttemptTimeout`, 30 s)",
			s.cfg.RetryMin == 100*time.Millisecond && s.cfg.RetryMax == 5*time.Second && s.cfg.AttemptTimeout == 30*time.Second},
		{"database `shoal` by default", s.History().Database() == "shoal"},
		{"clock ms << 16 | 16 random bits", true},
	} {
		assert.Contains(t, flat, claim.text)
		assert.True(t, claim.ok, "stated as %q", claim.text)
	}

	// Every metric is documented, and every documented stage exists.
	mfs, err := s.Registry().Gather()
	require.NoError(t, err)
	require.NotEmpty(t, mfs)
	for _, mf := range mfs {
		name := strings.TrimPrefix(mf.GetName(), "shoal_pipeline_snapshot_")
		assert.Contains(t, flat, "`"+name+"`", "metric %s is not documented", mf.GetName())
	}
	for _, st := range stages {
		assert.Contains(t, flat, "`"+st+"`", "stage %s", st)
	}
}
