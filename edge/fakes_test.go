package edge

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/binding"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

var errCatalogDown = errors.New("catalog unavailable (fake)")

// fakeCatalog is an in-memory Catalog with fault injection.
type fakeCatalog struct {
	mu        sync.Mutex
	accounts  map[string]fsm.Account
	tokens    map[string]fsm.Token // by hash
	hosts     map[string]fsm.Host
	dbs       map[string]fsm.Database
	down      bool
	gate      chan struct{} // when non-nil, Database() waits on it
	failWrite []error       // errors returned by the next CreateDatabase calls (before applying)
	lostWrite int           // next N CreateDatabase calls commit but return errCatalogDown
	now       func() time.Time

	calls       sync.Map // method → *atomic.Int64
	dbInFlight  atomic.Int64
	dbMaxFlight atomic.Int64
	created     []fsm.CreateDatabase
	// tokenGate, when non-nil, makes TokenByHash hang as an unreachable
	// catalog does: each call waits for a value on it (then fails as
	// unreachable) or for its close (then answers).
	tokenGate chan struct{}
}

func newFakeCatalog() *fakeCatalog {
	return &fakeCatalog{accounts: map[string]fsm.Account{}, tokens: map[string]fsm.Token{}, hosts: map[string]fsm.Host{},
		dbs: map[string]fsm.Database{}, now: time.Now}
}

func (c *fakeCatalog) count(m string) int64 {
	v, _ := c.calls.LoadOrStore(m, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func (c *fakeCatalog) enter(m string) error {
	v, _ := c.calls.LoadOrStore(m, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return errCatalogDown
	}
	return nil
}

func (c *fakeCatalog) setDown(d bool) { c.mu.Lock(); c.down = d; c.mu.Unlock() }

func (c *fakeCatalog) setTokenGate(g chan struct{}) { c.mu.Lock(); c.tokenGate = g; c.mu.Unlock() }

// revokeToken marks the token of secret revoked.
func (c *fakeCatalog) revokeToken(secret string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := HashToken(secret)
	t := c.tokens[h]
	t.Revoked = true
	c.tokens[h] = t
}

func (c *fakeCatalog) addAccount(id string, maxDBs int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.accounts[id] = fsm.Account{ID: id, Name: id, Tier: "free", Limits: fsm.Limits{MaxDatabases: maxDBs}}
}

func (c *fakeCatalog) addToken(secret, account string, admin bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := HashToken(secret)
	c.tokens[h] = fsm.Token{ID: "t-" + secret, AccountID: account, Admin: admin}
}

func (c *fakeCatalog) withHostAddr(d fsm.Database) fsm.Database {
	d.HostAddress = c.hosts[d.HostID].Address
	return d
}

func (c *fakeCatalog) CreateDatabase(ctx context.Context, cmd fsm.CreateDatabase) (fsm.Database, error) {
	if err := c.enter("CreateDatabase"); err != nil {
		return fsm.Database{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.created = append(c.created, cmd)
	if len(c.failWrite) > 0 {
		err := c.failWrite[0]
		c.failWrite = c.failWrite[1:]
		return fsm.Database{}, err
	}
	a, ok := c.accounts[cmd.AccountID]
	if !ok {
		return fsm.Database{}, fsm.ErrAccountNotFound
	}
	for _, d := range c.dbs {
		if d.UUID == cmd.UUID {
			return fsm.Database{}, fsm.ErrExists
		}
		if d.AccountID == cmd.AccountID && d.Name == cmd.Name && d.State == fsm.StateActive {
			return fsm.Database{}, fsm.ErrNameTaken
		}
	}
	if a.Limits.MaxDatabases > 0 && a.ActiveDatabases >= a.Limits.MaxDatabases {
		return fsm.Database{}, fsm.ErrDatabaseLimit
	}
	a.ActiveDatabases++
	c.accounts[a.ID] = a
	d := fsm.Database{UUID: cmd.UUID, AccountID: cmd.AccountID, Name: cmd.Name, ObjectID: cmd.ObjectID, HostID: cmd.HostID,
		Region: cmd.Region, Jurisdiction: cmd.Jurisdiction, ReadReplication: cmd.ReadReplication, State: fsm.StateActive,
		CreatedAt: c.now().UnixNano(), RoutingGeneration: 1}
	c.dbs[d.UUID] = d
	if c.lostWrite > 0 {
		c.lostWrite--
		return fsm.Database{}, errCatalogDown
	}
	return c.withHostAddr(d), nil
}

func (c *fakeCatalog) DeleteDatabase(ctx context.Context, cmd fsm.DeleteDatabase) (fsm.Database, error) {
	if err := c.enter("DeleteDatabase"); err != nil {
		return fsm.Database{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.dbs[cmd.UUID]
	if !ok || d.AccountID != cmd.AccountID || d.State != fsm.StateActive {
		return fsm.Database{}, fsm.ErrNotFound
	}
	d.State = fsm.StateDeleted
	c.dbs[d.UUID] = d
	a := c.accounts[d.AccountID]
	a.ActiveDatabases--
	c.accounts[a.ID] = a
	return c.withHostAddr(d), nil
}

func (c *fakeCatalog) UpdateDatabase(ctx context.Context, cmd fsm.UpdateDatabase) (fsm.Database, error) {
	if err := c.enter("UpdateDatabase"); err != nil {
		return fsm.Database{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.dbs[cmd.UUID]
	if !ok || d.AccountID != cmd.AccountID || d.State != fsm.StateActive {
		return fsm.Database{}, fsm.ErrNotFound
	}
	if cmd.ReadReplication != nil {
		d.ReadReplication = *cmd.ReadReplication
	}
	c.dbs[d.UUID] = d
	return c.withHostAddr(d), nil
}

func (c *fakeCatalog) Database(ctx context.Context, id string) (fsm.Database, error) {
	if err := c.enter("Database"); err != nil {
		return fsm.Database{}, err
	}
	n := c.dbInFlight.Add(1)
	defer c.dbInFlight.Add(-1)
	for {
		m := c.dbMaxFlight.Load()
		if n <= m || c.dbMaxFlight.CompareAndSwap(m, n) {
			break
		}
	}
	c.mu.Lock()
	gate := c.gate
	c.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return fsm.Database{}, ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.dbs[id]
	if !ok {
		return fsm.Database{}, fmt.Errorf("database %s: %w", id, fsm.ErrNotFound)
	}
	return c.withHostAddr(d), nil
}

func (c *fakeCatalog) DatabaseByName(ctx context.Context, acct, name string) (fsm.Database, error) {
	if err := c.enter("DatabaseByName"); err != nil {
		return fsm.Database{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.dbs {
		if d.AccountID == acct && d.Name == name && d.State == fsm.StateActive {
			return c.withHostAddr(d), nil
		}
	}
	return fsm.Database{}, fsm.ErrNotFound
}

func (c *fakeCatalog) ListDatabases(ctx context.Context, acct string, q fsm.ListQuery) ([]fsm.Database, int64, error) {
	if err := c.enter("ListDatabases"); err != nil {
		return nil, 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var all []fsm.Database
	for _, d := range c.dbs {
		if d.AccountID == acct && d.State == fsm.StateActive && (q.Name == "" || strings.Contains(d.Name, q.Name)) {
			all = append(all, c.withHostAddr(d))
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	from := (q.Page - 1) * q.PerPage
	if from > len(all) {
		from = len(all)
	}
	to := min(from+q.PerPage, len(all))
	return all[from:to], int64(len(all)), nil
}

func (c *fakeCatalog) Account(ctx context.Context, id string) (fsm.Account, error) {
	if err := c.enter("Account"); err != nil {
		return fsm.Account{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.accounts[id]
	if !ok {
		return fsm.Account{}, fsm.ErrAccountNotFound
	}
	return a, nil
}

func (c *fakeCatalog) TokenByHash(ctx context.Context, hash string) (fsm.Token, error) {
	if err := c.enter("TokenByHash"); err != nil {
		return fsm.Token{}, err
	}
	c.mu.Lock()
	gate := c.tokenGate
	c.mu.Unlock()
	if gate != nil {
		select {
		case _, open := <-gate:
			if open {
				return fsm.Token{}, errCatalogDown
			}
		case <-ctx.Done():
			return fsm.Token{}, ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.tokens[hash]
	if !ok {
		return fsm.Token{}, fsm.ErrNotFound
	}
	return t, nil
}

func (c *fakeCatalog) Hosts(ctx context.Context) ([]fsm.Host, error) {
	if err := c.enter("Hosts"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var hs []fsm.Host
	for _, h := range c.hosts {
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].ID < hs[j].ID })
	return hs, nil
}

func (c *fakeCatalog) CreateAccount(ctx context.Context, cmd fsm.CreateAccount) (fsm.Account, error) {
	if err := c.enter("CreateAccount"); err != nil {
		return fsm.Account{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.accounts[cmd.ID]; ok {
		return fsm.Account{}, fsm.ErrExists
	}
	a := fsm.Account{ID: cmd.ID, Name: cmd.Name, Tier: cmd.Tier, Limits: cmd.Limits, CreatedAt: c.now().UnixNano()}
	c.accounts[a.ID] = a
	return a, nil
}

func (c *fakeCatalog) UpdateAccount(ctx context.Context, cmd fsm.UpdateAccount) (fsm.Account, error) {
	if err := c.enter("UpdateAccount"); err != nil {
		return fsm.Account{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.accounts[cmd.ID]
	if !ok {
		return fsm.Account{}, fsm.ErrAccountNotFound
	}
	if cmd.Tier != nil {
		a.Tier = *cmd.Tier
	}
	if cmd.Limits != nil {
		a.Limits = *cmd.Limits
	}
	c.accounts[a.ID] = a
	return a, nil
}

func (c *fakeCatalog) CreateToken(ctx context.Context, cmd fsm.CreateToken) (fsm.Token, error) {
	if err := c.enter("CreateToken"); err != nil {
		return fsm.Token{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.accounts[cmd.AccountID]; !ok && !cmd.Admin {
		return fsm.Token{}, fsm.ErrAccountNotFound
	}
	t := fsm.Token{ID: cmd.ID, AccountID: cmd.AccountID, Name: cmd.Name, Admin: cmd.Admin}
	c.tokens[cmd.Hash] = t
	return t, nil
}

func (c *fakeCatalog) RevokeToken(ctx context.Context, cmd fsm.RevokeToken) (fsm.Token, error) {
	if err := c.enter("RevokeToken"); err != nil {
		return fsm.Token{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for h, t := range c.tokens {
		if t.ID == cmd.ID {
			t.Revoked = true
			c.tokens[h] = t
			return t, nil
		}
	}
	return fsm.Token{}, fsm.ErrNotFound
}

var _ Catalog = (*fakeCatalog)(nil)

// fakeHost is an httptest object host implementing the internal API contract
// closely enough for the edge: init/confirm/delete/info, query/raw (answers
// echo the SQL), bound endpoints verifying binding tokens.
type fakeHost struct {
	t    *testing.T
	now  func() time.Time
	srv  *httptest.Server
	keys *binding.Keyring

	mu       sync.Mutex
	objects  map[string]*fakeObject
	inits    []InitRequest
	initIDs  []string
	failInit int           // next N inits answer 503
	initGate chan struct{} // when non-nil, inits wait on it (outside mu)
	// damaged: the refusal the real host gives when the archive lost
	// what a restore needs (objecthost/restoredamage.go): time-travel
	// calls and inits restoring from the archive answer it, 400 7400.
	damaged   string
	queries   atomic.Int64
	lastHdr   http.Header
	lastQuery []byte // body of the last query or raw request
	// locates counts GET /v1/databases/{uuid}/objects; noLocate makes the
	// host answer it as a build without the route does (404 from its router).
	locates  atomic.Int64
	noLocate bool
}

type fakeObject struct {
	req       InitRequest
	state     string
	confirmed bool
	gen       int64
	imp       map[string]any  // the import job: cumulative messages, like the real host
	epoch     int64           // binding epoch (revoke all)
	revoked   map[string]bool // revoked binding token IDs
}

func newFakeHost(t *testing.T, keys *binding.Keyring) *fakeHost {
	h := &fakeHost{t: t, now: time.Now, keys: keys, objects: map[string]*fakeObject{}}
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *fakeHost) addr() string { return strings.TrimPrefix(h.srv.URL, "http://") }

// object returns a copy of an object's state (nil if unknown).
func (h *fakeHost) object(id string) *fakeObject {
	h.mu.Lock()
	defer h.mu.Unlock()
	o := h.objects[id]
	if o == nil {
		return nil
	}
	c := *o
	return &c
}

func (h *fakeHost) serve(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	if strings.HasSuffix(r.URL.Path, "/query") || strings.HasSuffix(r.URL.Path, "/raw") {
		// Queries only: a create's background confirm (no request ID) may
		// arrive after the query a test just sent.
		h.lastHdr = r.Header.Clone()
		h.lastQuery = body
	}
	gate := h.initGate
	h.mu.Unlock()
	if gate != nil && len(parts) >= 4 && parts[1] == "objects" && parts[len(parts)-1] == "init" {
		<-gate
	}
	switch {
	case len(parts) == 4 && parts[1] == "databases" && parts[3] == "objects" && r.Method == http.MethodGet:
		h.serveLocate(w, r, parts[2])
	case len(parts) == 3 && parts[1] == "bound":
		h.serveBound(w, r, parts[2], body)
	case len(parts) >= 3 && parts[1] == "objects":
		h.serveObject(w, r, parts[2], strings.Join(parts[3:], "/"), body)
	default:
		v4.WriteError(w, 404, 7404, "no such endpoint")
	}
}

func (h *fakeHost) serveObject(w http.ResponseWriter, r *http.Request, id, op string, body []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	o := h.objects[id]
	info := func(o *fakeObject) ObjectInfo {
		return ObjectInfo{ObjectID: id, DatabaseUUID: o.req.DatabaseUUID, AccountID: o.req.AccountID, Name: o.req.Name,
			State: o.state, Confirmed: o.confirmed, RoutingGeneration: o.gen, FileSize: 8192, NumTables: 2}
	}
	if op == "init" {
		if h.failInit > 0 {
			h.failInit--
			v4.WriteError(w, 503, 7503, "host overloaded")
			return
		}
		var in InitRequest
		require.NoError(h.t, json.Unmarshal(body, &in))
		if in.RestoreFrom != nil && h.damaged != "" {
			v4.WriteError(w, 400, 7400, h.damaged)
			return
		}
		h.inits = append(h.inits, in)
		h.initIDs = append(h.initIDs, id)
		if o != nil && o.req.DatabaseUUID != in.DatabaseUUID {
			v4.WriteError(w, 409, 7409, "object exists")
			return
		}
		o = &fakeObject{req: in, state: "active", gen: in.RoutingGeneration}
		h.objects[id] = o
		v4.WriteResult(w, info(o))
		return
	}
	if o == nil {
		v4.WriteError(w, 404, 7404, "unknown object")
		return
	}
	if r.Header.Get(HeaderDatabase) != o.req.DatabaseUUID || r.Header.Get(HeaderAccount) != o.req.AccountID {
		v4.WriteError(w, 421, 7421, "wrong host")
		return
	}
	if strings.HasPrefix(op, "time_travel/") {
		if h.damaged != "" {
			v4.WriteError(w, 400, 7400, h.damaged)
			return
		}
		v4.WriteResult(w, map[string]string{"bookmark": "00000001-00000000-00000000-" + strings.Repeat("0", 64), "previous_bookmark": "", "message": "restored"})
		return
	}
	switch op {
	case "confirm":
		o.confirmed = true
		v4.WriteResult(w, info(o))
	case "delete":
		o.state = "deleted"
		v4.WriteResult(w, info(o))
	case "":
		v4.WriteResult(w, info(o))
	case "query", "raw":
		if o.state != "active" {
			v4.WriteError(w, 410, 7410, "database deleted")
			return
		}
		h.answer(w, op, body)
	case "export":
		v4.WriteResult(w, map[string]any{})
	case "export/download":
		w.Header().Set("Content-Type", "application/sql")
		_, _ = w.Write([]byte("CREATE TABLE t(x);\n"))
	case "bindings":
		v4.WriteResult(w, map[string]any{"epoch": o.epoch, "revoked": len(o.revoked)})
	case "bindings/revoke":
		var in struct {
			All     bool   `json:"all"`
			TokenID string `json:"token_id"`
		}
		_ = json.Unmarshal(body, &in)
		if in.All {
			o.epoch++
			o.revoked = nil
		} else {
			if o.revoked == nil {
				o.revoked = map[string]bool{}
			}
			o.revoked[in.TokenID] = true
		}
		v4.WriteResult(w, map[string]any{"epoch": o.epoch, "revoked": len(o.revoked)})
	case "import/ingest":
		var in struct{ Filename string }
		_ = json.Unmarshal(body, &in)
		o.imp = map[string]any{"type": "import", "status": "active", "at_bookmark": in.Filename,
			"messages": []string{"Import started"}, "progress": map[string]any{"bytes": 0}}
		v4.WriteResult(w, o.imp)
	case "import/poll":
		var in struct {
			CurrentBookmark string `json:"current_bookmark"`
		}
		_ = json.Unmarshal(body, &in)
		if o.imp == nil || in.CurrentBookmark != o.imp["at_bookmark"] {
			v4.WriteError(w, 400, 7400, "no import with that bookmark on this database")
			return
		}
		msgs := o.imp["messages"].([]string)
		switch {
		case strings.HasPrefix(in.CurrentBookmark, "bad"):
			o.imp["status"], o.imp["error"] = "error", "near \"SELEC\": syntax error"
			msgs = append(msgs, "near \"SELEC\": syntax error")
		case len(msgs) == 1:
			msgs = append(msgs, "Imported 1 statements (9 bytes)")
		default:
			o.imp["status"] = "complete"
			o.imp["result"] = map[string]any{"final_bookmark": in.CurrentBookmark, "num_queries": 1}
		}
		o.imp["messages"] = msgs
		v4.WriteResult(w, o.imp)
	default:
		if name, ok := strings.CutPrefix(op, "import/upload/"); ok {
			sum := md5.Sum(body)
			v4.WriteResult(w, map[string]any{"filename": name, "size": len(body), "etag": hex.EncodeToString(sum[:])})
			return
		}
		v4.WriteError(w, 404, 7404, "no such op")
	}
}

// serveLocate answers which objects of database uuid the host holds for
// the account in X-Shoal-Account, as objecthost/locate.go does.
func (h *fakeHost) serveLocate(w http.ResponseWriter, r *http.Request, uuid string) {
	h.locates.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.noLocate {
		v4.WriteError(w, 404, 7404, "no such route")
		return
	}
	var out event.LocateAnswer
	for id, o := range h.objects {
		if o.req.DatabaseUUID == uuid && o.req.AccountID == r.Header.Get(HeaderAccount) {
			out.Objects = append(out.Objects, event.LocatedObject{ObjectID: id, AccountID: o.req.AccountID,
				State: o.state, RoutingGeneration: o.gen, Confirmed: o.confirmed})
		}
	}
	if len(out.Objects) == 0 {
		v4.WriteError(w, 404, 7404, "database not found")
		return
	}
	v4.WriteResult(w, out)
}

// failingSQL is the statement the fake host answers with a SQL error.
const failingSQL = "SELECT nope"

func (h *fakeHost) answer(w http.ResponseWriter, kind string, body []byte) {
	h.queries.Add(1)
	var q QueryBody
	_ = json.Unmarshal(body, &q)
	sqls := []string{}
	if q.SQL != nil {
		sqls = append(sqls, *q.SQL)
	}
	for _, st := range q.Batch {
		sqls = append(sqls, *st.SQL)
	}
	var out []map[string]any
	for _, s := range sqls {
		if s == failingSQL {
			v4.WriteError(w, 400, 7500, "no such column: nope: SQLITE_ERROR")
			return
		}
		meta := map[string]any{"duration": 0.25, "changes": 0, "last_row_id": 0, "changed_db": false, "size_after": 8192,
			"rows_read": 1, "rows_written": 0, "served_by_region": "WEUR", "served_by_primary": true,
			"timings": map[string]any{"sql_duration_ms": 0.25}}
		res := map[string]any{"success": true, "meta": meta}
		if kind == "raw" {
			res["results"] = map[string]any{"columns": []string{"sql"}, "rows": [][]any{{s}}}
		} else {
			res["results"] = []map[string]any{{"sql": s}}
		}
		out = append(out, res)
	}
	v4.WriteResult(w, out)
}

func (h *fakeHost) serveBound(w http.ResponseWriter, r *http.Request, kind string, body []byte) {
	tok, err := binding.FromHeader(r.Header)
	if err != nil {
		v4.WriteError(w, 401, 10000, "no binding token")
		return
	}
	c, err := h.keys.Verify(tok, h.now())
	if err != nil {
		v4.WriteError(w, 401, 10000, "bad binding token")
		return
	}
	h.mu.Lock()
	o := h.objects[c.ObjectID]
	revoked := o != nil && (c.Epoch < o.epoch || o.revoked[c.TokenID])
	h.mu.Unlock()
	if o == nil || o.req.DatabaseUUID != c.DatabaseUUID || o.req.AccountID != c.AccountID || o.gen != c.Generation {
		v4.WriteError(w, 421, 7421, "wrong host")
		return
	}
	if revoked {
		v4.WriteError(w, 401, 10000, "binding token revoked")
		return
	}
	h.answer(w, kind, body)
}

// testClock is a settable clock.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)} }
func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}
func (c *testClock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
