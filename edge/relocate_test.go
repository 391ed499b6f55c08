package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// recoveryCatalog is an in-memory RecoveryCatalog with the catalog's
// compare-and-set semantics (raftmeta/fsm/cmd_relocate_database.go).
type recoveryCatalog struct {
	mu      sync.Mutex
	hosts   map[string]fsm.Host
	dbs     map[string]fsm.Database
	fenced  map[string]bool
	failRel int // the next n relocations fail with an unknown outcome
	steal   map[string]bool
}

func (c *recoveryCatalog) Hosts(context.Context) ([]fsm.Host, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []fsm.Host
	for _, h := range c.hosts {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (c *recoveryCatalog) SetHostState(_ context.Context, s fsm.SetHostState) (fsm.Host, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.hosts[s.ID]
	if !ok {
		return h, fsm.ErrNotFound
	}
	if s.IdleSince > 0 && h.UpdatedAt > s.IdleSince {
		return h, fsm.ErrConflict
	}
	h.State = s.State
	c.hosts[s.ID] = h
	return h, nil
}

func (c *recoveryCatalog) HostDatabasesPage(_ context.Context, hostID, after string, limit int) (fsm.HostDatabasesPage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id, d := range c.dbs {
		if d.HostID == hostID && id > after {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	var p fsm.HostDatabasesPage
	for i, id := range ids {
		if i == limit {
			p.Next = ids[i-1]
			break
		}
		p.Databases = append(p.Databases, c.dbs[id])
	}
	return p, nil
}

func (c *recoveryCatalog) RelocateDatabase(_ context.Context, r fsm.RelocateDatabase) (fsm.Database, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failRel > 0 {
		c.failRel--
		return fsm.Database{}, errors.New("catalog unreachable")
	}
	d, ok := c.dbs[r.UUID]
	switch {
	case !ok:
		return d, fsm.ErrNotFound
	case d.ObjectID == r.ObjectID:
		return d, nil
	case c.fenced[r.ObjectID]:
		return d, fsm.ErrExists
	case c.steal[r.UUID]:
		d.ObjectID, d.HostID, d.RoutingGeneration = "stolen", "h2", d.RoutingGeneration+1
		c.dbs[r.UUID] = d
		return d, fsm.ErrConflict
	case d.ObjectID != r.FromObjectID:
		return d, fsm.ErrConflict
	}
	d.ObjectID, d.HostID, d.HostAddress = r.ObjectID, r.HostID, c.hosts[r.HostID].Address
	d.RoutingGeneration++
	c.dbs[r.UUID] = d
	return d, nil
}

// recoveryHosts records inits; noArchive databases answer as a host does
// for a database without archived history, failInit hosts refuse.
type recoveryHosts struct {
	mu        sync.Mutex
	inits     map[string][]InitRequest // host address → inits
	noArchive map[string]bool
	damaged   map[string]bool // archive damaged (objecthost/restoredamage.go's 400)
	failInit  map[string]bool
	// deletedOnHost: databases whose archive holds a delete marker
	// (objecthost/deletemark.go); their inits answer as a host does.
	deletedOnHost map[string]bool
	confirms      int
	attempts      map[string]int // database → inits tried
}

func (h *recoveryHosts) Init(_ context.Context, addr, objectID string, in InitRequest) (ObjectInfo, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.attempts == nil {
		h.attempts = map[string]int{}
	}
	h.attempts[in.DatabaseUUID]++
	if h.failInit[addr] {
		return ObjectInfo{}, &HostError{Status: http.StatusServiceUnavailable, Code: 7503, Message: "down"}
	}
	if h.damaged[in.DatabaseUUID] {
		return ObjectInfo{}, &HostError{Status: http.StatusBadRequest, Code: 7400, Message: "the database's newest archived point can no longer be restored: the archive of its history is damaged (records 5..9 of generation 000661b3478aab8b are lost or fail their checksum); the database was not relocated"}
	}
	if h.deletedOnHost[in.DatabaseUUID] {
		return ObjectInfo{}, &HostError{Status: http.StatusGone, Code: 7410, Message: "database was deleted on its host: database " + in.DatabaseUUID +
			" was deleted on its host (object x, at 2026-12-01T00:00:00Z) and the archive holds its delete marker; a catalog restored from an older backup may list it again, but it is not restored from the archive (shoal cluster resurrected)"}
	}
	if h.noArchive[in.DatabaseUUID] && !in.RestoreFrom.EmptyIfNone {
		return ObjectInfo{}, &HostError{Status: http.StatusBadRequest, Code: 7400, Message: "invalid request: database " + in.DatabaseUUID + " has no archived history to restore from"}
	}
	if h.inits == nil {
		h.inits = map[string][]InitRequest{}
	}
	h.inits[addr] = append(h.inits[addr], in)
	return ObjectInfo{ObjectID: objectID, DatabaseUUID: in.DatabaseUUID}, nil
}

func (h *recoveryHosts) Confirm(context.Context, Route) error {
	h.mu.Lock()
	h.confirms++
	h.mu.Unlock()
	return nil
}

func newRecoveryFixture(dbs int) (*recoveryCatalog, *recoveryHosts) {
	now := time.Now().UnixNano()
	cat := &recoveryCatalog{hosts: map[string]fsm.Host{
		"h1": {ID: "h1", Address: "a1", Region: "weur", State: fsm.HostStateActive, UpdatedAt: now},
		"h2": {ID: "h2", Address: "a2", Region: "weur", State: fsm.HostStateActive, UpdatedAt: now},
		"h3": {ID: "h3", Address: "a3", Region: "enam", State: fsm.HostStateActive, UpdatedAt: now},
		"e1": {ID: "e1", Address: "ae", Region: "weur", Jurisdiction: "eu", State: fsm.HostStateActive, UpdatedAt: now},
	}, dbs: map[string]fsm.Database{}, fenced: map[string]bool{}, steal: map[string]bool{}}
	for i := 0; i < dbs; i++ {
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		cat.dbs[id] = fsm.Database{UUID: id, AccountID: "a", Name: fmt.Sprintf("db%d", i), ObjectID: "old-" + id,
			HostID: "h1", Region: "weur", State: fsm.StateActive, RoutingGeneration: 1}
	}
	return cat, &recoveryHosts{noArchive: map[string]bool{}, failInit: map[string]bool{}}
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestRecoverLostHost: every database of the lost host is initialised from
// its own archive on another host at generation + 1 and relocated; a
// jurisdiction is kept; a database without archived history is reported
// and left unless EmptyIfNone; a failing target is avoided; an unknown
// relocation outcome is retried with the same object; a concurrent winner
// counts as already moved; a rerun resumes with what is left.
func TestRecoverLostHost(t *testing.T) {
	ctx := context.Background()
	cat, hosts := newRecoveryFixture(30)
	eu := "00000000-0000-4000-8000-000000000007"
	d := cat.dbs[eu]
	d.Jurisdiction = "eu"
	cat.dbs[eu] = d
	noArch := "00000000-0000-4000-8000-000000000003"
	hosts.noArchive[noArch] = true
	cat.steal["00000000-0000-4000-8000-000000000011"] = true
	hosts.failInit["a3"] = true
	cat.failRel = 2

	rc := NewRecoverer(cat, hosts, RecoverOptions{Concurrency: 4, Logger: quietLog})
	_, err := rc.Recover(ctx, "h1")
	require.ErrorIs(t, err, ErrHostNotLost, "only a host declared lost")
	_, err = rc.DeclareLost(ctx, "h1", time.Time{})
	require.NoError(t, err)

	var progress int
	rc.o.Progress = func(RecoverProgress) { progress++ }
	rep, err := rc.Recover(ctx, "h1")
	require.NoError(t, err)
	assert.Equal(t, 30, rep.Listed)
	assert.Equal(t, 28, rep.Relocated)
	assert.Equal(t, 1, rep.Already)
	assert.Equal(t, []string{noArch}, rep.NoArchive)
	assert.False(t, rep.Complete())
	assert.Equal(t, 30, progress)
	for id, d := range cat.dbs {
		switch id {
		case noArch:
			assert.Equal(t, "h1", d.HostID)
		case eu:
			assert.Equal(t, "e1", d.HostID, "the jurisdiction is a legal constraint")
		case "00000000-0000-4000-8000-000000000011":
			assert.Equal(t, "stolen", d.ObjectID)
		default:
			assert.Contains(t, []string{"h2", "e1"}, d.HostID, "never the lost host, never the failing one")
			assert.Equal(t, int64(2), d.RoutingGeneration)
		}
	}
	for _, in := range hosts.inits["a2"] {
		require.NotNil(t, in.RestoreFrom)
		assert.Equal(t, in.DatabaseUUID, in.RestoreFrom.DatabaseUUID, "restored from its own archive")
		assert.Empty(t, in.RestoreFrom.Bookmark, "at its last archived commit")
		assert.Equal(t, int64(2), in.RoutingGeneration)
	}

	// A rerun resumes with what is left; EmptyIfNone takes the rest.
	rc = NewRecoverer(cat, hosts, RecoverOptions{EmptyIfNone: true, Logger: quietLog})
	rep, err = rc.Recover(ctx, "h1")
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Listed)
	assert.Equal(t, 1, rep.Relocated)
	assert.True(t, rep.Complete())
}

// TestRecoverDamagedArchive: a database whose archive the store damaged is
// reported failed with the host's message after one init, not tried on
// every other host (they all read the same archive); the others move.
func TestRecoverDamagedArchive(t *testing.T) {
	ctx := context.Background()
	cat, hosts := newRecoveryFixture(3)
	bad := "00000000-0000-4000-8000-000000000001"
	hosts.damaged = map[string]bool{bad: true}
	rc := NewRecoverer(cat, hosts, RecoverOptions{Concurrency: 1, Logger: quietLog})
	_, err := rc.DeclareLost(ctx, "h1", time.Time{})
	require.NoError(t, err)
	rep, err := rc.Recover(ctx, "h1")
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Relocated)
	require.Contains(t, rep.Failed, bad)
	assert.Contains(t, rep.Failed[bad], "can no longer be restored")
	assert.Equal(t, 1, hosts.attempts[bad], "not retried on other hosts")
	assert.Equal(t, "h1", cat.dbs[bad].HostID)
}

// TestAutoRecover: a host silent past the bound is declared lost and
// recovered; a host that reported is not; two silent hosts at once are a
// mass of destructive decisions: none is declared.
func TestAutoRecover(t *testing.T) {
	ctx := context.Background()
	cat, hosts := newRecoveryFixture(5)
	now := time.Now()
	o := AutoOptions{After: 10 * time.Minute, Now: func() time.Time { return now }}
	rc := NewRecoverer(cat, hosts, RecoverOptions{Logger: quietLog})
	assert.Equal(t, "none", rc.autoCheck(ctx, o))

	now = now.Add(11 * time.Minute) // every host silent: brake
	assert.Equal(t, "brake", rc.autoCheck(ctx, o))
	for _, h := range cat.hosts {
		assert.Equal(t, fsm.HostStateActive, h.State)
	}
	for id, h := range cat.hosts { // all but h1 report again
		if id != "h1" {
			h.UpdatedAt = now.UnixNano()
			cat.hosts[id] = h
		}
	}
	assert.Equal(t, "declared", rc.autoCheck(ctx, o))
	assert.Equal(t, fsm.HostStateLost, cat.hosts["h1"].State)
	p, err := cat.HostDatabasesPage(ctx, "h1", "", 100)
	require.NoError(t, err)
	assert.Empty(t, p.Databases, "recovered")
	assert.Equal(t, "none", rc.autoCheck(ctx, o), "a lost host is not declared again")

	// The compare-and-set: a host that reported after the bound read is
	// not declared lost.
	_, err = rc.DeclareLost(ctx, "h2", now.Add(-time.Minute))
	require.ErrorIs(t, err, fsm.ErrConflict)
}

// TestRecoverLeavesDatabasesDeletedOnHost: a database the catalog lists
// active (a catalog restored from an older backup) but whose archive
// holds its delete marker is not relocated: it is reported in
// DeletedOnHost, stays on the lost host in the catalog, is never deleted
// by recovery, and keeps the report incomplete — also with EmptyIfNone.
func TestRecoverLeavesDatabasesDeletedOnHost(t *testing.T) {
	ctx := context.Background()
	cat, hosts := newRecoveryFixture(5)
	zombie := "00000000-0000-4000-8000-000000000002"
	hosts.deletedOnHost = map[string]bool{zombie: true}
	for _, empty := range []bool{false, true} {
		rc := NewRecoverer(cat, hosts, RecoverOptions{Logger: quietLog, EmptyIfNone: empty})
		_, err := rc.DeclareLost(ctx, "h1", time.Time{})
		require.NoError(t, err)
		rep, err := rc.Recover(ctx, "h1")
		require.NoError(t, err)
		require.Contains(t, rep.DeletedOnHost, zombie)
		assert.Contains(t, rep.DeletedOnHost[zombie], "delete marker")
		assert.Len(t, rep.DeletedOnHost, 1)
		assert.Empty(t, rep.Failed, "not a failure to retry on other hosts")
		assert.False(t, rep.Complete())
		d := cat.dbs[zombie]
		assert.Equal(t, "h1", d.HostID)
		assert.Equal(t, "old-"+zombie, d.ObjectID)
		assert.Equal(t, fsm.StateActive, d.State, "recovery deletes nothing")
	}
	for id, d := range cat.dbs {
		if id != zombie {
			assert.NotEqual(t, "h1", d.HostID)
		}
	}
}
