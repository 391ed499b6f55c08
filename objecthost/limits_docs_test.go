package objecthost

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// The error messages docs/api.md quotes are the ones the host sends, and
// DESIGN.md names the limits feed's series and its start wait.
func TestLimitsDocsMatchCode(t *testing.T) {
	api, err := os.ReadFile("../docs/api.md")
	require.NoError(t, err)
	until := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	for _, msg := range []string{
		sqlexec.AccountStorageLimitMessage,
		sqlexec.DatabaseSizeLimitMessage,
		(&RowLimitError{Reason: "rows_written_per_day", Until: until}).Error(),
	} {
		assert.Contains(t, string(api), msg, "docs/api.md quotes the message")
	}
	design, err := os.ReadFile("DESIGN.md")
	require.NoError(t, err)
	flat := strings.Join(strings.Fields(string(design)), " ")
	f := &limitsFeed{h: &Host{}}
	for _, c := range f.collectors() {
		name := descName(c)
		short := strings.TrimPrefix(name, "shoal_objecthost_limits")
		assert.True(t, strings.Contains(flat, name) || strings.Contains(flat, "`…"+short+"`"), "DESIGN.md names %s", name)
	}
	o, err := newLimitsFeed(LimitsFeedOptions{Brokers: []string{"127.0.0.1:1"}}, &Host{})
	require.NoError(t, err)
	o.cl.Close()
	assert.Contains(t, flat, "`StartWait` ("+strconv.Itoa(int(o.o.StartWait.Seconds()))+" s)")
}

// descName is a collector's metric name.
func descName(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc, 1)
	c.Describe(ch)
	s := (<-ch).String()
	const p = `fqName: "`
	i := strings.Index(s, p)
	if i < 0 {
		return s
	}
	s = s[i+len(p):]
	return s[:strings.IndexByte(s, '"')]
}
