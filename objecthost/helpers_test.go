package objecthost

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fakeCatalog answers heartbeats from a map and records every call.
type fakeCatalog struct {
	mu       sync.Mutex
	dbs      map[string]fsm.HeartbeatState
	accounts map[string]fsm.Account
	calls    int
	sizes    []int
	fail     bool
	hosts    []fsm.RegisterHost
	loads    []fsm.ReportHostLoad
	perUUID  map[string]int

	staleUnknown map[string]bool // UUIDs a stale Heartbeat answers unknown
	confirmFail  bool            // ConfirmHeartbeat fails
	confirms     []string        // UUIDs ConfirmHeartbeat was asked about
	// confirmMisses are UUIDs ConfirmHeartbeat answers unknown although
	// dbs has them: their create committed just after the confirming read.
	confirmMisses map[string]bool
	fenced        []string   // UUIDs FenceOrphans fenced
	fencedObjects []string   // objects FenceObjects fenced
	hostState     string     // what RegisterHostState answers (default active)
	hostList      []fsm.Host // what Hosts answers
	fenceFail     bool       // FenceOrphans fails
	accountReads  int        // Account calls (storage refresh)
	restores      int64      // the catalog's restore count, in every answer
}

// seen returns how many heartbeats each UUID sent.
func (c *fakeCatalog) seen() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.perUUID))
	for k, v := range c.perUUID {
		out[k] = v
	}
	return out
}

func newFakeCatalog() *fakeCatalog {
	return &fakeCatalog{dbs: map[string]fsm.HeartbeatState{}, accounts: map[string]fsm.Account{}}
}

var errCatalogDown = errors.New("catalog down")

// Heartbeat answers as a stale replica would: from stale where it has an
// entry for the UUID (staleUnknown: as if it had no row), else the truth.
func (c *fakeCatalog) Heartbeat(_ context.Context, uuids []string) (fsm.HeartbeatAnswer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	c.sizes = append(c.sizes, len(uuids))
	if c.perUUID == nil {
		c.perUUID = map[string]int{}
	}
	for _, u := range uuids {
		c.perUUID[u]++
	}
	if c.fail {
		return fsm.HeartbeatAnswer{}, errCatalogDown
	}
	return c.answerLocked(uuids, true), nil
}

// ConfirmHeartbeat answers linearizably: always the truth.
func (c *fakeCatalog) ConfirmHeartbeat(_ context.Context, uuids []string) (fsm.HeartbeatAnswer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.confirms = append(c.confirms, uuids...)
	if c.fail || c.confirmFail {
		return fsm.HeartbeatAnswer{}, errCatalogDown
	}
	ans := c.answerLocked(uuids, false)
	for i, st := range ans.Databases {
		if c.confirmMisses[st.UUID] {
			ans.Databases[i] = fsm.HeartbeatState{UUID: st.UUID}
		}
	}
	return ans, nil
}

// FenceOrphans fences the UUIDs dbs does not have, like the catalog.
func (c *fakeCatalog) FenceOrphans(_ context.Context, _ string, uuids []string) (fsm.FenceAnswer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail || c.fenceFail {
		return fsm.FenceAnswer{}, errCatalogDown
	}
	var ans fsm.FenceAnswer
	for _, u := range uuids {
		if _, ok := c.dbs[u]; ok {
			ans.Known = append(ans.Known, u)
		} else {
			ans.Fenced = append(ans.Fenced, u)
			c.fenced = append(c.fenced, u)
		}
	}
	return ans, nil
}

func (c *fakeCatalog) answerLocked(uuids []string, stale bool) fsm.HeartbeatAnswer {
	ans := fsm.HeartbeatAnswer{Accounts: map[string]fsm.Account{}, CatalogRestores: c.restores}
	for _, u := range uuids {
		st, ok := c.dbs[u]
		if !ok {
			st = fsm.HeartbeatState{UUID: u, Known: false}
		}
		if stale && c.staleUnknown[u] {
			st = fsm.HeartbeatState{UUID: u, Known: false}
		}
		ans.Databases = append(ans.Databases, st)
		if a, ok := c.accounts[st.AccountID]; ok && st.Known {
			ans.Accounts[st.AccountID] = a
		}
	}
	return ans
}

// FenceObjects fences the objects dbs does not name, like the catalog.
func (c *fakeCatalog) FenceObjects(_ context.Context, _ string, objs []fsm.ObjectRef) (fsm.FenceAnswer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail || c.fenceFail {
		return fsm.FenceAnswer{}, errCatalogDown
	}
	var ans fsm.FenceAnswer
	for _, o := range objs {
		if st, ok := c.dbs[o.UUID]; ok && st.ObjectID == o.ObjectID {
			ans.KnownObjects = append(ans.KnownObjects, o.ObjectID)
		} else {
			ans.FencedObjects = append(ans.FencedObjects, o.ObjectID)
			c.fencedObjects = append(c.fencedObjects, o.ObjectID)
		}
	}
	return ans, nil
}

// RegisterHostState registers like RegisterHost and answers hostState.
func (c *fakeCatalog) RegisterHostState(ctx context.Context, h fsm.RegisterHost) (fsm.Host, error) {
	if err := c.RegisterHost(ctx, h); err != nil {
		return fsm.Host{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.hostState
	if st == "" {
		st = fsm.HostStateActive
	}
	return fsm.Host{ID: h.ID, Address: h.Address, State: st}, nil
}

// setObject sets a database's state with the object the catalog names.
func (c *fakeCatalog) setObject(uuid, account, objectID string, gen int64) {
	c.mu.Lock()
	c.dbs[uuid] = fsm.HeartbeatState{UUID: uuid, Known: true, State: fsm.StateActive, AccountID: account, RoutingGeneration: gen, ObjectID: objectID}
	c.mu.Unlock()
}

// Hosts is HostLister: hostList, as set by the test.
func (c *fakeCatalog) Hosts(_ context.Context) ([]fsm.Host, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]fsm.Host(nil), c.hostList...), nil
}

func (c *fakeCatalog) RegisterHost(_ context.Context, h fsm.RegisterHost) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail {
		return errCatalogDown
	}
	c.hosts = append(c.hosts, h)
	return nil
}

func (c *fakeCatalog) ReportHostLoad(_ context.Context, l fsm.ReportHostLoad) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail {
		return errCatalogDown
	}
	c.loads = append(c.loads, l)
	return nil
}

func (c *fakeCatalog) set(uuid, account, state string, gen int64) {
	c.mu.Lock()
	c.dbs[uuid] = fsm.HeartbeatState{UUID: uuid, Known: true, State: state, AccountID: account, RoutingGeneration: gen}
	c.mu.Unlock()
}

func (c *fakeCatalog) setAccount(a fsm.Account) {
	c.mu.Lock()
	c.accounts[a.ID] = a
	c.mu.Unlock()
}

func (c *fakeCatalog) callCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

var (
	_ Catalog           = (*fakeCatalog)(nil)
	_ RelocationCatalog = (*fakeCatalog)(nil)
)

// testHost is a Host on a temp dir with a fake clock, catalog and sinks.
type testHost struct {
	*Host
	dir   string
	clock *fakeClock
	cat   *fakeCatalog
	sink  *MemSink
	cfg   Config
}

func newTestHost(t *testing.T, mod func(*Config)) *testHost {
	t.Helper()
	th := &testHost{dir: t.TempDir(), clock: newFakeClock(), cat: newFakeCatalog(), sink: &MemSink{}}
	th.cfg = Config{
		ID: "host-1", Dir: th.dir, Address: "127.0.0.1:1", Region: "WEUR",
		Catalog: th.cat, Usage: th.sink, Sizes: th.sink, Routes: th.sink,
		Now: th.clock.Now, Manual: true,
	}
	if mod != nil {
		mod(&th.cfg)
	}
	th.open(t)
	return th
}

func (th *testHost) open(t *testing.T) {
	t.Helper()
	h, err := Open(th.cfg)
	require.NoError(t, err)
	th.Host = h
	t.Cleanup(func() { _ = h.Close() })
}

// reopen closes the host and opens a new one on the same directory.
func (th *testHost) reopen(t *testing.T) {
	t.Helper()
	require.NoError(t, th.Host.Close())
	th.open(t)
}

func newObjectID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

type db struct {
	obj, uuid, account string
}

func newDB(account string) db {
	return db{obj: newObjectID(), uuid: uuid.NewString(), account: account}
}

func (d db) init() InitRequest {
	return InitRequest{DatabaseUUID: d.uuid, AccountID: d.account, Name: "db-" + d.obj[:6]}
}

func (d db) id() Identity { return Identity{DatabaseUUID: d.uuid, AccountID: d.account} }

func (th *testHost) mustInit(t *testing.T, d db) ObjectInfo {
	t.Helper()
	info, err := th.Init(context.Background(), d.obj, d.init())
	require.NoError(t, err)
	return info
}

// envelope is a decoded v4 response.
type envelope struct {
	Result  json.RawMessage `json:"result"`
	Success bool            `json:"success"`
	Errors  []v4.Error      `json:"errors"`
}

// call does one HTTP request against srv and decodes the envelope.
func call(t *testing.T, client *http.Client, srv *httptest.Server, method, path string, d *db, body any) (int, envelope) {
	t.Helper()
	var rd *bytes.Reader
	switch b := body.(type) {
	case nil:
		rd = bytes.NewReader(nil)
	case string:
		rd = bytes.NewReader([]byte(b))
	default:
		j, err := json.Marshal(b)
		require.NoError(t, err)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	require.NoError(t, err)
	if d != nil {
		req.Header.Set(HeaderDatabase, d.uuid)
		req.Header.Set(HeaderAccount, d.account)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var env envelope
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&env))
	return resp.StatusCode, env
}

func errCode(env envelope) int {
	if len(env.Errors) == 0 {
		return 0
	}
	return env.Errors[0].Code
}

const time4h = 4 * time.Hour

// Account makes fakeCatalog an AccountReader (the storage refresh).
func (c *fakeCatalog) Account(_ context.Context, id string) (fsm.Account, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.accountReads++
	if c.fail {
		return fsm.Account{}, errCatalogDown
	}
	a, ok := c.accounts[id]
	if !ok {
		return fsm.Account{}, fsm.ErrAccountNotFound
	}
	return a, nil
}
