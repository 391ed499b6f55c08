package chsink

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The ClickHouse sections of pipeline/DESIGN.md state defaults and the
// DDL; they are checked against the code so the doc cannot drift.
func TestDesignDocMatchesCode(t *testing.T) {
	raw, err := os.ReadFile("../DESIGN.md")
	require.NoError(t, err)
	doc := string(raw)
	i := strings.Index(doc, "## ClickHouse sink (`pipeline/chsink`)")
	require.GreaterOrEqual(t, i, 0, "the ClickHouse sink section")
	doc = doc[i:]
	flat := strings.Join(strings.Fields(doc), " ") // claims may wrap

	var c Config
	c.setDefaults()
	for _, claim := range []struct {
		text string
		ok   bool
	}{
		{"Consumer group `shoal-chsink`", c.Group == "shoal-chsink"},
		{"topic `usage`", c.Topic == "usage"},
		{"`MaxBatch` events (100,000)", c.MaxBatch == 100_000},
		{"`FlushInterval` (1 s)", c.FlushInterval == time.Second},
		{"`RetryMin` 100 ms doubling to `RetryMax` 5 s", c.RetryMin == 100*time.Millisecond && c.RetryMax == 5*time.Second},
		{"`InsertTimeout` 30 s", c.InsertTimeout == 30*time.Second},
		{"`ShutdownTimeout` (10 s)", c.ShutdownTimeout == 10*time.Second},
		{"`DedupeWindow`, 262,144", c.DedupeWindow == 262_144},
		{"database `shoal` by default", DefaultDatabase == "shoal"},
	} {
		assert.Contains(t, flat, claim.text)
		assert.True(t, claim.ok, "default stated as %q", claim.text)
	}

	// The DDL block shows every table with the code's engine, partition
	// and sorting keys, and every column.
	ws := regexp.MustCompile(`\s+`)
	for _, stmt := range SchemaDDL("shoal")[1:] {
		name := regexp.MustCompile(`TABLE IF NOT EXISTS shoal\.(\w+)`).FindStringSubmatch(stmt)[1]
		assert.Contains(t, flat, "CREATE TABLE shoal."+name+" (", name)
		cols := regexp.MustCompile(`(?m)^\s+(\w+)\s+(\w+),?$`).FindAllStringSubmatch(stmt, -1)
		require.GreaterOrEqual(t, len(cols), 3, "columns parsed from the DDL of %s", name)
		for _, m := range cols {
			assert.Regexp(t, regexp.MustCompile(`\b`+m[1]+` `+m[2]+`\b`), flat, "%s.%s in DESIGN.md", name, m[1])
		}
		for _, key := range []string{"PARTITION BY", "ORDER BY"} {
			if j := strings.Index(stmt, key); j >= 0 {
				line := ws.ReplaceAllString(strings.SplitN(stmt[j:], "\n", 2)[0], " ")
				assert.Contains(t, flat, line, name)
			}
		}
	}
}
