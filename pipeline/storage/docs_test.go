package storage

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDesignDocMatchesCode: the "Storage consumer" section of
// pipeline/DESIGN.md states this package's defaults, cap and metric names;
// they are checked here so the doc stays true.
func TestDesignDocMatchesCode(t *testing.T) {
	b, err := os.ReadFile("../DESIGN.md")
	require.NoError(t, err)
	doc := string(b)
	i := strings.Index(doc, "## Storage consumer")
	require.GreaterOrEqual(t, i, 0, "pipeline/DESIGN.md has no Storage consumer section")
	sec := doc[i:]
	if j := strings.Index(sec[3:], "\n## "); j >= 0 {
		sec = sec[:j+3]
	}
	flat := strings.Join(strings.Fields(sec), " ")

	assert.Equal(t, "shoal-storage", DefaultGroup)
	assert.Contains(t, flat, "`shoal-storage`")
	assert.Equal(t, 5000, DefaultMaxBatch)
	assert.Contains(t, flat, "`MaxBatch` records (default 5,000)")
	assert.Equal(t, 100*time.Millisecond, DefaultMaxWait)
	assert.Contains(t, flat, "`MaxWait` (100 ms)")
	assert.Equal(t, 8, MaxConsumers)
	assert.Contains(t, flat, "`storage.MaxConsumers` (8)")
	var cfg Config
	cfg.Brokers, cfg.Catalog = []string{"x"}, newFakeCatalog()
	require.NoError(t, cfg.setDefaults())
	assert.Equal(t, 100*time.Millisecond, cfg.RetryMin)
	assert.Equal(t, 5*time.Second, cfg.RetryMax)
	assert.Contains(t, flat, "(100 ms doubling to 5 s)")
	assert.Equal(t, 1, cfg.Consumers)
	assert.Contains(t, flat, "(`Config.Consumers`, default 1;")

	c, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Catalog: newFakeCatalog()})
	require.NoError(t, err)
	defer c.Close()
	c.c.batchSize.Observe(1) // histograms appear once observed
	c.c.writeSeconds.Observe(1)
	c.c.attemptCount.Observe(1)
	mfs, err := c.Registry().Gather()
	require.NoError(t, err)
	require.NotEmpty(t, mfs)
	for _, mf := range mfs {
		name := strings.TrimPrefix(mf.GetName(), "shoal_storage_consumer_")
		assert.Contains(t, flat, "`"+name+"`", "metric %s is not documented", mf.GetName())
	}
}
