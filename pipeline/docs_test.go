package pipeline

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// DESIGN.md states the producer's defaults and the topics table; they are
// checked against the code here so the doc cannot drift.
func TestDesignDocMatchesCode(t *testing.T) {
	raw, err := os.ReadFile("DESIGN.md")
	require.NoError(t, err)
	doc := string(raw)

	var c Config
	c.setDefaults()
	for _, claim := range []struct {
		text string
		ok   bool
	}{
		{"`MaxBufferedBytes` (32 MiB)", c.MaxBufferedBytes == 32<<20},
		{"`MaxBufferedRecords`\n  (100,000)", c.MaxBufferedRecords == 100_000},
		{"`StallTimeout` (5 s", c.StallTimeout == 5*time.Second},
		{"`ReplayBufferBytes` (8 MiB)", c.ReplayBufferBytes == 8<<20},
		{"`SpillQueueBytes` (8 MiB", c.SpillQueueBytes == 8<<20},
		{"`MaxSpillBytes` (1 GiB)", c.MaxSpillBytes == 1<<30},
		{"`SpillSegmentBytes` (64 MiB", c.SpillSegmentBytes == 64<<20},
		{"`SpillSyncInterval`\n  (1 s)", c.SpillSyncInterval == time.Second},
		{"linger\n  10 ms", c.Linger == 10*time.Millisecond},
	} {
		assert.Contains(t, doc, claim.text)
		assert.True(t, claim.ok, "default stated as %q", claim.text)
	}
	assert.Contains(t, doc, "numbered from 2^32")
	assert.Equal(t, uint64(1)<<32, firstSegNum)
	assert.Contains(t, doc, "magic `SHSPILL1`")
	assert.Equal(t, "SHSPILL1", segMagic)

	// The topics table: one row per default topic, same partitions and
	// cleanup policy.
	row := regexp.MustCompile("(?m)^\\| `(\\w+)` \\| (\\d+) \\| (\\w+) \\| ([^|]*?) \\|")
	rows := row.FindAllStringSubmatch(doc, -1)
	specs := DefaultTopics()
	require.Len(t, rows, len(specs))
	for i, spec := range specs {
		assert.Equal(t, spec.Name, rows[i][1])
		assert.Equal(t, strconv.Itoa(int(spec.Partitions)), rows[i][2], spec.Name)
		assert.Equal(t, spec.Configs["cleanup.policy"], rows[i][3], spec.Name)
		if strings.Contains(rows[i][0], "delete") {
			retention := map[string]time.Duration{"7 days": 7 * 24 * time.Hour, "1 hour": time.Hour}[rows[i][4]]
			assert.Equal(t, ms(retention), spec.Configs["retention.ms"], spec.Name)
		}
	}
}
