package edge

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// RaftmetaCatalog adapts a raftmeta.Client to Catalog, choosing each read's
// consistency: stale follower reads everywhere the edge tolerates staleness,
// bypassing the client's own result cache where the edge caches itself
// (routes in bbolt, tokens with a documented TTL) so staleness does not stack.
// The lost-create check reads from the leader: it must see the write that the
// leader just refused a duplicate of.
type RaftmetaCatalog struct {
	C *raftmeta.Client
}

var (
	_ Catalog       = RaftmetaCatalog{}
	_ auditRecorder = RaftmetaCatalog{}
)

// RecordAudit records an action done outside the catalog in its audit log.
func (r RaftmetaCatalog) RecordAudit(ctx context.Context, a fsm.RecordAudit) error {
	return r.C.RecordAudit(ctx, a)
}

func (r RaftmetaCatalog) CreateDatabase(ctx context.Context, cmd fsm.CreateDatabase) (fsm.Database, error) {
	return r.C.CreateDatabase(ctx, cmd)
}

var _ BatchCreator = RaftmetaCatalog{}

// CreateDatabasesAs is BatchCreator: the creates in one request, each its
// own command with its own audit record (raftmeta.Client.CreateDatabasesAs).
func (r RaftmetaCatalog) CreateDatabasesAs(ctx context.Context, cmds []fsm.CreateDatabase, audits []*fsm.Audit) ([]fsm.Database, []error) {
	return r.C.CreateDatabasesAs(ctx, cmds, audits)
}

func (r RaftmetaCatalog) DeleteDatabase(ctx context.Context, cmd fsm.DeleteDatabase) (fsm.Database, error) {
	return r.C.DeleteDatabase(ctx, cmd.AccountID, cmd.UUID)
}

func (r RaftmetaCatalog) UpdateDatabase(ctx context.Context, cmd fsm.UpdateDatabase) (fsm.Database, error) {
	return r.C.UpdateDatabase(ctx, cmd)
}

// Database reads a database's row from a follower. A follower that has not
// yet applied a create made a moment ago through another edge answers "not
// found"; rather than cache that as a negative entry (a wrong 404 for its
// TTL), a not-found is confirmed once on the leader (a lease read). Unknown
// UUIDs thus cost one leader read each, bounded like every catalog read of the
// edge by the fallback's cap, singleflight and breaker, and then sit in the
// negative cache.
func (r RaftmetaCatalog) Database(ctx context.Context, uuid string) (fsm.Database, error) {
	d, err := r.C.Database(ctx, uuid, raftmeta.ReadOptions{Consistency: raftmeta.Stale, NoCache: true})
	if isNotFound(err) {
		return r.C.Database(ctx, uuid, raftmeta.ReadOptions{Consistency: raftmeta.Leader, NoCache: true})
	}
	return d, err
}

func (r RaftmetaCatalog) DatabaseByName(ctx context.Context, accountID, name string) (fsm.Database, error) {
	return r.C.DatabaseByName(ctx, accountID, name, raftmeta.ReadOptions{Consistency: raftmeta.Leader, NoCache: true})
}

// ListDatabases lists from a follower. An account the follower does not know
// yet (created a moment ago, possibly through another edge, while the
// follower lagged) is confirmed with a linearizable read before the edge
// answers 403 with it: a stale read bounds how old an answer may be, not
// whether a negative one is true (a follower resumed after a pause can
// receive, and serve at, a commit index the leader sent before the pause).
//
// Read-your-writes: a name lookup that finds nothing (how clients resolve a
// name, e.g. `shoal d1 execute NAME` right after `create NAME`) is
// confirmed the same way, and a list for an account that wrote through this
// edge moments ago (leaderReads on ctx) is read from the leader.
func (r RaftmetaCatalog) ListDatabases(ctx context.Context, accountID string, q fsm.ListQuery) ([]fsm.Database, int64, error) {
	if leaderReadsOn(ctx) {
		return r.C.ListDatabases(ctx, accountID, q, raftmeta.ReadOptions{Consistency: raftmeta.Leader, NoCache: true})
	}
	dbs, total, err := r.C.ListDatabases(ctx, accountID, q, raftmeta.StaleRead())
	if isNotFound(err) || (err == nil && q.Name != "" && len(dbs) == 0) {
		return r.C.ListDatabases(ctx, accountID, q, raftmeta.ReadOptions{Consistency: raftmeta.Linearizable, NoCache: true})
	}
	return dbs, total, err
}

type leaderReadsKey struct{}

// withLeaderReads marks ctx: the catalog reads of this request that are
// stale by default go to the leader (see recentWrites).
func withLeaderReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, leaderReadsKey{}, true)
}

func leaderReadsOn(ctx context.Context) bool { v, _ := ctx.Value(leaderReadsKey{}).(bool); return v }

// recentWrites remembers the accounts that created, changed or deleted a
// database through this edge within the window, so that their next lists
// read from the leader: a follower serves stale reads up to max_stale
// behind, and "I created it and the list does not show it" is the one
// staleness users notice. Bounded: past max entries, expired ones are
// dropped, then the map is reset (costing only leader reads' cheapness).
type recentWrites struct {
	window time.Duration
	max    int
	now    func() time.Time
	mu     sync.Mutex
	m      map[string]time.Time
}

func newRecentWrites(window time.Duration, now func() time.Time) *recentWrites {
	return &recentWrites{window: window, max: 100_000, now: now, m: make(map[string]time.Time)}
}

func (w *recentWrites) wrote(acct string) {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.m) >= w.max {
		for k, t := range w.m {
			if now.Sub(t) >= w.window {
				delete(w.m, k)
			}
		}
		if len(w.m) >= w.max {
			clear(w.m)
		}
	}
	w.m[acct] = now
}

func (w *recentWrites) recent(acct string) bool {
	w.mu.Lock()
	t, ok := w.m[acct]
	w.mu.Unlock()
	return ok && w.now().Sub(t) < w.window
}

// Account reads an account from a follower (through the client's per-account
// cache). Read-your-writes: an account the follower does not know may have
// been created a moment ago through another edge, so a not-found is
// confirmed with a linearizable read before the edge refuses anything with it.
func (r RaftmetaCatalog) Account(ctx context.Context, id string) (fsm.Account, error) {
	a, err := r.C.Account(ctx, id, raftmeta.StaleRead())
	if isNotFound(err) {
		return r.C.Account(ctx, id, raftmeta.ReadOptions{Consistency: raftmeta.Linearizable, NoCache: true})
	}
	return a, err
}

// TokenByHash reads a token from a follower. Read-your-writes: a token just
// minted (through any edge) may not have reached that follower, so a
// not-found is confirmed with a linearizable read before the edge answers
// 401 or caches the miss; a negative entry therefore always predates the
// mint of that token.
func (r RaftmetaCatalog) TokenByHash(ctx context.Context, hash string) (fsm.Token, error) {
	t, err := r.C.TokenByHash(ctx, hash, raftmeta.ReadOptions{Consistency: raftmeta.Stale, NoCache: true})
	if isNotFound(err) {
		return r.C.TokenByHash(ctx, hash, raftmeta.ReadOptions{Consistency: raftmeta.Linearizable, NoCache: true})
	}
	return t, err
}

func isNotFound(err error) bool {
	return errors.Is(err, fsm.ErrNotFound) || errors.Is(err, fsm.ErrAccountNotFound)
}

func (r RaftmetaCatalog) Hosts(ctx context.Context) ([]fsm.Host, error) {
	return r.C.Hosts(ctx, raftmeta.StaleRead())
}

func (r RaftmetaCatalog) CreateAccount(ctx context.Context, cmd fsm.CreateAccount) (fsm.Account, error) {
	return r.C.CreateAccount(ctx, cmd)
}

func (r RaftmetaCatalog) UpdateAccount(ctx context.Context, cmd fsm.UpdateAccount) (fsm.Account, error) {
	return r.C.UpdateAccount(ctx, cmd)
}

func (r RaftmetaCatalog) CreateToken(ctx context.Context, cmd fsm.CreateToken) (fsm.Token, error) {
	return r.C.CreateToken(ctx, cmd)
}

func (r RaftmetaCatalog) RevokeToken(ctx context.Context, cmd fsm.RevokeToken) (fsm.Token, error) {
	return r.C.RevokeToken(ctx, cmd.ID)
}
