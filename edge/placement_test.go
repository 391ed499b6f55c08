package edge

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// lockedBuffer is a log sink the server writes from its handlers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A jurisdiction no registered host serves can never succeed: 400/7400
// naming it, no Retry-After, one log line, no object initialised. A
// jurisdiction whose only host is not active now may recover: 503 with
// Retry-After. Once the host is active, the create lands there.
func TestCreateInJurisdictionWithoutHost(t *testing.T) {
	logs := &lockedBuffer{}
	e := newEnv(t, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(logs, nil)) })

	a := e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "eu-db", "jurisdiction": "EU"})
	require.Equal(t, 400, a.Status, "%s", a.Raw)
	assert.Equal(t, 7400, a.code())
	assert.Contains(t, a.Errors[0].Message, `jurisdiction "eu"`)
	assert.Contains(t, a.Errors[0].Message, "jurisdictions served: none")
	assert.Empty(t, a.Header.Get("Retry-After"), "a request that cannot succeed is not to be retried")
	assert.Equal(t, 1, strings.Count(logs.String(), "no object host serves the jurisdiction"), "logged once: %s", logs)
	for _, h := range e.hosts {
		h.mu.Lock()
		assert.Empty(t, h.inits, "nothing was initialised")
		h.mu.Unlock()
	}
	e.cat.mu.Lock()
	assert.Empty(t, e.cat.created, "nothing reached the catalog")
	e.cat.mu.Unlock()

	// An eu host exists but is down: transient.
	e.cat.mu.Lock()
	h := e.cat.hosts["h2"]
	h.Jurisdiction, h.State = "eu", "down"
	e.cat.hosts["h2"] = h
	e.cat.mu.Unlock()
	e.clock.Advance(time.Minute) // the host list cache expires
	a = e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "eu-db", "jurisdiction": "eu"})
	assert.Equal(t, 503, a.Status, "%s", a.Raw)
	assert.Equal(t, 7503, a.code())
	assert.NotEmpty(t, a.Header.Get("Retry-After"))

	// Another jurisdiction, while eu is known: the refusal lists what is served.
	a = e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "us-db", "jurisdiction": "fedramp"})
	assert.Equal(t, 400, a.Status, "%s", a.Raw)
	assert.Contains(t, a.Errors[0].Message, "jurisdictions served: eu")

	e.cat.mu.Lock()
	h.State = "active"
	e.cat.hosts["h2"] = h
	e.cat.mu.Unlock()
	e.clock.Advance(time.Minute)
	a = e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "eu-db", "jurisdiction": "eu"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	e.hosts[1].mu.Lock()
	assert.Len(t, e.hosts[1].inits, 1, "placed on the eu host")
	e.hosts[1].mu.Unlock()
}

// Creates go to a host whose init batcher is busy (a batch in flight or
// inits queued) while it is within placementSlack databases of the least
// loaded, so concurrent creates share one host's init batch; past the
// slack, or with no busy host, the least loaded is chosen as before. The
// eligibility rules come first: a busy host outside the jurisdiction or in
// exclude is never chosen for its batch.
func TestPlacementJoinsABusyHostsBatch(t *testing.T) {
	hosts := []fsm.Host{
		{ID: "h1", Address: "a1", Region: "weur", Capacity: 1000, Databases: 10},
		{ID: "h2", Address: "a2", Region: "weur", Capacity: 1000, Databases: 12},
		{ID: "h3", Address: "a3", Region: "weur", Capacity: 1000, Databases: 10, Jurisdiction: "eu"},
	}
	busy := map[string]int{}
	queued := func(addr string) int { return busy[addr] }
	place := func(jur string, exclude map[string]bool, pending map[string]int64) string {
		t.Helper()
		h, err := placeAmongQueued(hosts, jur, "weur", exclude, pending, queued)
		require.NoError(t, err)
		return h.ID
	}

	assert.Equal(t, "h1", place("", nil, map[string]int64{}), "no busy host: the least loaded")
	busy["a2"] = 3
	assert.Equal(t, "h2", place("", nil, map[string]int64{}), "a busy host within the slack takes the create")
	busy["a1"] = 5
	assert.Equal(t, "h1", place("", nil, map[string]int64{}), "the busiest host within the slack")
	assert.Equal(t, "h2", place("", map[string]bool{"h1": true}, map[string]int64{}), "exclude still holds")
	busy["a1"] = 0
	assert.Equal(t, "h1", place("", nil, map[string]int64{"h2": placementSlack}),
		"a busy host more than the slack above the least loaded is passed over")
	busy["a1"], busy["a2"], busy["a3"] = 0, 9, 0
	assert.Equal(t, "h3", place("eu", nil, map[string]int64{}), "the jurisdiction is never traded for a batch")

	// Without a queue function (relocations) the rule is the least loaded.
	h, err := placeAmong(hosts, "", "weur", nil, map[string]int64{})
	require.NoError(t, err)
	assert.Equal(t, "h1", h.ID)

	// Spread over many placements with one host always busy: the skew is
	// bounded by the slack.
	pending := map[string]int64{}
	busy["a1"], busy["a2"], busy["a3"] = 0, 1, 0
	for range 1000 {
		place("", nil, pending)
	}
	load := func(id string, base int64) int64 { return base + pending[id] }
	assert.LessOrEqual(t, load("h2", 12)-min(load("h1", 10), load("h3", 10)), int64(placementSlack)+1,
		"placements %v", pending)
}
