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
