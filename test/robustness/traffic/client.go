package traffic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Client is one D1 API user (an account and its token) talking to the edges,
// recording every call into its History. Safe for concurrent use.
type Client struct {
	edges   []string
	acct    string
	bearer  string
	hc      *http.Client
	catalog *raftmeta.Client
	h       *History

	sentMu sync.Mutex
	sent   map[string]int // per database, every /query request sent (recorded or not)

	restoreMu sync.Mutex
	restores  map[string][]time.Time // per database, restores sent (ReserveRestore)
}

// requestTimeout bounds one call: longer than the edge's own budgets (a
// catalog write retries for a few seconds), so a timeout is a stuck call.
const requestTimeout = 15 * time.Second

// NewClient creates a paid account and a token through the first edge's
// admin API and waits until every edge accepts the token. catalog is used
// for the linearizable gets and lists only.
func NewClient(ctx context.Context, edges []string, admin string, catalog *raftmeta.Client, h *History) (*Client, error) {
	return NewAccountClient(ctx, edges, admin, catalog, h, AccountSpec{Name: "robustness", Tier: "paid"})
}

// AccountSpec is the account a Client creates: its tier and, when set, its
// own limits (replacing the tier's: fsm.Limits, 0 fields unlimited but for
// the daily row limits, whose 0 means the tier's).
type AccountSpec struct {
	Name   string
	Tier   string
	Limits *fsm.Limits
}

// NewAccountClient is NewClient for the account spec describes.
func NewAccountClient(ctx context.Context, edges []string, admin string, catalog *raftmeta.Client, h *History, spec AccountSpec) (*Client, error) {
	c := &Client{edges: edges, hc: &http.Client{Timeout: requestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		catalog: catalog, h: h}
	var acct struct{ ID string }
	body := map[string]any{"name": spec.Name, "tier": spec.Tier}
	if spec.Limits != nil {
		body["limits"] = spec.Limits
	}
	if err := c.admin(ctx, edges[0]+"/admin/v1/accounts", admin, body, &acct); err != nil {
		return nil, err
	}
	var tok struct{ Token string }
	if err := c.admin(ctx, edges[0]+"/admin/v1/accounts/"+acct.ID+"/tokens", admin, map[string]any{"name": spec.Name}, &tok); err != nil {
		return nil, err
	}
	c.acct, c.bearer = acct.ID, "Bearer "+tok.Token
	for i := range edges {
		if err := retry(ctx, 30*time.Second, func() error {
			a := c.do(ctx, i, http.MethodGet, "", nil)
			if a.outcome() != OK {
				return errors.New(a.text())
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("token never accepted by edge %d: %w", i+1, err)
		}
	}
	return c, nil
}

// Sent is, per database, how many queries the client sent (recorded
// operations and unrecorded set-up and validation queries alike): an upper
// bound of the queries the hosts can have billed.
func (c *Client) Sent() map[string]int {
	c.sentMu.Lock()
	defer c.sentMu.Unlock()
	out := make(map[string]int, len(c.sent))
	for k, v := range c.sent {
		out[k] = v
	}
	return out
}

// Account is the client's account ID.
func (c *Client) Account() string { return c.acct }

// Edges is how many edges the client spreads calls over.
func (c *Client) Edges() int { return len(c.edges) }

func (c *Client) admin(ctx context.Context, url, token string, body, out any) error {
	return retry(ctx, 30*time.Second, func() error {
		a := c.call(ctx, http.MethodPost, url, "Bearer "+token, body)
		if a.outcome() != OK {
			return errors.New(a.text())
		}
		return json.Unmarshal(a.Result, out)
	})
}

// Create makes a database through edge. Op.DB is its UUID if acknowledged.
func (c *Client) Create(ctx context.Context, client, edge int, name string) Op {
	return c.h.Add(c.create(ctx, client, edge, name))
}

// CreateUnrecorded is Create kept out of the history (set-up of databases
// outside the checked account: the limited accounts').
func (c *Client) CreateUnrecorded(ctx context.Context, edge int, name string) Op {
	return c.create(ctx, 0, edge, name)
}

func (c *Client) create(ctx context.Context, client, edge int, name string) Op {
	call := c.h.Now()
	a := c.do(ctx, edge, http.MethodPost, "", map[string]any{"name": name})
	op := Op{Client: client, Kind: Create, Name: name, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text()}
	var d struct {
		UUID string `json:"uuid"`
	}
	if op.Outcome == OK {
		if json.Unmarshal(a.Result, &d) != nil || d.UUID == "" {
			op.Outcome, op.Answer = Unknown, "200 without a uuid: "+a.text()
		}
		op.DB = d.UUID
	}
	return op
}

// Delete deletes a database through edge.
func (c *Client) Delete(ctx context.Context, client, edge int, db string) Op {
	call := c.h.Now()
	a := c.do(ctx, edge, http.MethodDelete, "/"+db, nil)
	return c.h.Add(Op{Client: client, Kind: Delete, DB: db, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text()})
}

// EdgeGet reads the database object through edge: the edge's read level
// (route cache, follower reads; stale within the catalog's bound).
func (c *Client) EdgeGet(ctx context.Context, client, edge int, db string) Op {
	call := c.h.Now()
	a := c.do(ctx, edge, http.MethodGet, "/"+db, nil)
	op := Op{Client: client, Kind: EdgeGet, DB: db, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text()}
	op.Found = op.Outcome == OK
	return c.h.Add(op)
}

// LinGet reads the database's catalog row at the linearizable level. Found
// is whether the row exists and is active.
func (c *Client) LinGet(ctx context.Context, client int, db string) Op {
	call := c.h.Now()
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	d, err := c.catalog.Database(ctx, db, raftmeta.LinearizableRead())
	op := Op{Client: client, Kind: LinGet, DB: db, Call: call, Return: c.h.Now()}
	switch {
	case err == nil:
		op.Outcome, op.Found, op.Answer = OK, d.State == fsm.StateActive, "state "+string(d.State)
	case errors.Is(err, fsm.ErrNotFound):
		op.Outcome, op.Answer = OK, err.Error()
	default:
		op.Outcome, op.Answer = Unknown, err.Error()
	}
	return c.h.Add(op)
}

// Exec runs statements on db through edge, unrecorded (schema set-up).
func (c *Client) Exec(ctx context.Context, edge int, db string, stmts ...string) error {
	_, err := c.ExecRows(ctx, edge, db, stmts...)
	return err
}

// ExecRows is Exec, also returning the rows the statements wrote
// (meta.rows_written, summed).
func (c *Client) ExecRows(ctx context.Context, edge int, db string, stmts ...string) (int64, error) {
	var batch []any
	for _, s := range stmts {
		batch = append(batch, map[string]any{"sql": s})
	}
	a := c.do(ctx, edge, http.MethodPost, "/"+db+"/query", map[string]any{"batch": batch})
	if a.outcome() != OK {
		return 0, errors.New(a.text())
	}
	return a.rowsWritten(), nil
}

// FreeInsert writes the row v = value into db's table t, as Insert, under
// its own kind: the limited accounts' writes (Load's LimitWriters).
func (c *Client) FreeInsert(ctx context.Context, client, edge int, db string, value int64) Op {
	return c.write(ctx, client, edge, FreeInsert, db, value, "INSERT INTO t (v) VALUES (?)")
}

// Insert writes the row v = value into db's table t.
func (c *Client) Insert(ctx context.Context, client, edge int, db string, value int64) Op {
	return c.write(ctx, client, edge, Insert, db, value, "INSERT INTO t (v) VALUES (?)")
}

// RegWrite sets db's register to value.
func (c *Client) RegWrite(ctx context.Context, client, edge int, db string, value int64) Op {
	return c.write(ctx, client, edge, RegWrite, db, value, "UPDATE reg SET v = ? WHERE k = 0")
}

func (c *Client) write(ctx context.Context, client, edge int, kind Kind, db string, value int64, sql string) Op {
	call := c.h.Now()
	a := c.do(ctx, edge, http.MethodPost, "/"+db+"/query", map[string]any{"sql": sql, "params": []any{value}})
	op := Op{Client: client, Kind: kind, DB: db, Value: value, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text()}
	if op.Outcome == OK && a.changes() != 1 {
		op.Outcome, op.Answer = Unknown, "200 with changes != 1: "+a.text()
	}
	if op.Outcome == OK {
		op.Rows = a.rowsWritten()
	}
	return c.h.Add(op)
}

// RegRead reads db's register.
func (c *Client) RegRead(ctx context.Context, client, edge int, db string) Op {
	call := c.h.Now()
	vals, a := c.column(ctx, edge, db, "SELECT v FROM reg WHERE k = 0")
	op := Op{Client: client, Kind: RegRead, DB: db, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text()}
	if op.Outcome == OK {
		if len(vals) != 1 {
			op.Outcome, op.Answer = Unknown, fmt.Sprintf("%d register rows: %s", len(vals), a.text())
		} else {
			op.Value, op.Found = vals[0], true
		}
	}
	return c.h.Add(op)
}

// MintBinding mints a binding token for db through edge (POST
// …/database/{id}/binding, with the account's API token; not recorded).
func (c *Client) MintBinding(ctx context.Context, edge int, db string) (string, error) {
	a := c.call(ctx, http.MethodPost, c.edges[edge]+"/client/v4/accounts/"+c.acct+"/d1/database/"+db+"/binding", c.bearer, map[string]any{"ttl_seconds": 3600})
	if a.outcome() != OK {
		return "", errors.New(a.text())
	}
	var m struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(a.Result, &m); err != nil || m.Token == "" {
		return "", fmt.Errorf("binding: %s", a.text())
	}
	return m.Token, nil
}

// BoundRead counts db's rows in t through edge with a binding token
// (POST /client/v4/bound/query): the credential carries the route, so a
// cold edge serves it with the catalog unreachable.
func (c *Client) BoundRead(ctx context.Context, client, edge int, db, token string) Op {
	c.sentMu.Lock()
	if c.sent == nil {
		c.sent = map[string]int{}
	}
	c.sent[db]++
	c.sentMu.Unlock()
	call := c.h.Now()
	a := c.call(ctx, http.MethodPost, c.edges[edge]+"/client/v4/bound/query", "Binding "+token, map[string]any{"sql": "SELECT count(*) AS v FROM t"})
	op := Op{Client: client, Kind: BoundRead, DB: db, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text()}
	if op.Outcome == OK {
		vals, err := a.column()
		if err != nil || len(vals) != 1 {
			op.Outcome, op.Answer = Unknown, fmt.Sprintf("unexpected count: %s", a.text())
		} else {
			op.Value, op.Found = vals[0], true
		}
	}
	return c.h.Add(op)
}

// LinList lists the account's active databases in the catalog at the
// linearizable level: one page of up to fsm.MaxPerPage, read in one
// transaction (an account with more than a page is answered Unknown: a
// list spanning pages is no single observation). Op.Listed is the UUIDs.
func (c *Client) LinList(ctx context.Context, client int) Op {
	call := c.h.Now()
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	dbs, total, err := c.catalog.ListDatabases(ctx, c.acct, fsm.ListQuery{PerPage: fsm.MaxPerPage}, raftmeta.LinearizableRead())
	op := Op{Client: client, Kind: List, Call: call, Return: c.h.Now()}
	switch {
	case err != nil:
		op.Outcome, op.Answer = Unknown, err.Error()
	case total > int64(len(dbs)):
		op.Outcome, op.Answer = Unknown, fmt.Sprintf("%d of %d databases on one page", len(dbs), total)
	default:
		op.Outcome, op.Answer = OK, fmt.Sprintf("%d databases", len(dbs))
		op.Listed = make([]string, 0, len(dbs))
		for _, d := range dbs {
			op.Listed = append(op.Listed, d.UUID)
		}
	}
	return c.h.Add(op)
}

// Rows reads every value of db's table t (validation: not recorded).
func (c *Client) Rows(ctx context.Context, edge int, db string) ([]int64, Outcome, string) {
	vals, a := c.column(ctx, edge, db, "SELECT v FROM t")
	return vals, a.outcome(), a.text()
}

// List is every database the account's list shows through edge (not
// recorded), page by page (the API serves at most 10,000 per page; a long
// schedule creates more). Called once the load has stopped, so the pages
// agree.
func (c *Client) List(ctx context.Context, edge int) (map[string]bool, error) {
	const perPage = 10000
	out := map[string]bool{}
	for page := 1; ; page++ {
		a := c.do(ctx, edge, http.MethodGet, fmt.Sprintf("?per_page=%d&page=%d", perPage, page), nil)
		if a.outcome() != OK {
			return nil, errors.New(a.text())
		}
		var items []struct {
			UUID string `json:"uuid"`
		}
		if err := json.Unmarshal(a.Result, &items); err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
		for _, it := range items {
			out[it.UUID] = true
		}
		if len(items) < perPage {
			return out, nil
		}
	}
}

func (c *Client) column(ctx context.Context, edge int, db, sql string) ([]int64, answer) {
	a := c.do(ctx, edge, http.MethodPost, "/"+db+"/query", map[string]any{"sql": sql})
	if a.outcome() != OK {
		return nil, a
	}
	out, err := a.column()
	if err != nil {
		a.err = err
		return nil, a
	}
	return out, a
}

// column is column v of a single-statement answer's rows.
func (a answer) column() ([]int64, error) {
	var res []struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(a.Result, &res); err != nil || len(res) != 1 {
		return nil, fmt.Errorf("unexpected result: %s", a.text())
	}
	var out []int64
	for _, r := range res[0].Results {
		f, ok := r["v"].(float64)
		if !ok {
			return nil, fmt.Errorf("non-integer v: %s", a.text())
		}
		out = append(out, int64(f))
	}
	return out, nil
}

// answer is one HTTP answer in the v4 envelope, or the error instead.
type answer struct {
	status  int
	Result  json.RawMessage `json:"result"`
	Success bool            `json:"success"`
	Errors  []struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
	raw []byte
	err error
	// badBody: an HTTP answer whose body was not a v4 envelope.
	badBody bool
}

// notDone are the messages of the host's 503 answers (passed through by the
// edge) that say the request was not carried out: objecthost.ErrRestoring
// (a query while its database is restored) and a restore refused because
// the archive store is down. Another wording falls back to Unknown: the
// safe direction.
var notDone = []string{"database is being restored, retry", "the archive store is unavailable, nothing was changed; retry",
	"time travel is behind on this database (the host cannot write its history log yet); nothing was changed; retry",
	"time travel is behind on this database (the host cannot write its history log yet); retry"}

func (a answer) outcome() Outcome {
	switch {
	case a.err != nil:
		return Unknown
	case a.status == http.StatusOK && a.Success:
		return OK
	case a.status == http.StatusNotFound:
		return NotFound
	case a.status == http.StatusServiceUnavailable && len(a.Errors) == 1 && slices.Contains(notDone, a.Errors[0].Message):
		return Failed
	case a.status == http.StatusTooManyRequests && len(a.Errors) == 1 && a.Errors[0].Code == v4.CodeRowLimit:
		return Limited
	case a.status == http.StatusTooManyRequests || a.status >= 500:
		return Unknown
	default:
		return Refused
	}
}

func (a answer) text() string {
	if a.err != nil {
		return a.err.Error()
	}
	code := 0
	if len(a.Errors) > 0 {
		code = a.Errors[0].Code
	}
	s := strings.TrimSpace(string(a.raw))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return fmt.Sprintf("%d/%d %s", a.status, code, s)
}

// rowsWritten is meta.rows_written summed over a /query answer's
// statements.
func (a answer) rowsWritten() int64 {
	var res []struct {
		Meta struct {
			RowsWritten int64 `json:"rows_written"`
		} `json:"meta"`
	}
	if json.Unmarshal(a.Result, &res) != nil {
		return 0
	}
	var n int64
	for _, r := range res {
		n += r.Meta.RowsWritten
	}
	return n
}

// changes is meta.changes of a single-statement /query answer, or -1.
func (a answer) changes() int {
	var res []struct {
		Meta struct {
			Changes int `json:"changes"`
		} `json:"meta"`
	}
	if json.Unmarshal(a.Result, &res) != nil || len(res) != 1 {
		return -1
	}
	return res[0].Meta.Changes
}

func (c *Client) do(ctx context.Context, edge int, method, path string, body any) answer {
	if db, ok := strings.CutSuffix(path, "/query"); ok {
		c.sentMu.Lock()
		if c.sent == nil {
			c.sent = map[string]int{}
		}
		c.sent[strings.TrimPrefix(db, "/")]++
		c.sentMu.Unlock()
	}
	return c.call(ctx, method, c.edges[edge]+"/client/v4/accounts/"+c.acct+"/d1/database"+path, c.bearer, body)
}

func (c *Client) call(ctx context.Context, method, url, auth string, body any) answer {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{err: err}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", auth)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{status: resp.StatusCode, err: err}
	}
	a := answer{status: resp.StatusCode, raw: raw}
	if err := json.Unmarshal(raw, &a); err != nil {
		a.err = fmt.Errorf("status %d, not a v4 envelope: %s", resp.StatusCode, clip(raw))
		a.badBody = true
	}
	return a
}

// retry calls fn until it succeeds or within passes.
func retry(ctx context.Context, within time.Duration, fn func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Restore budget: the hosts allow 10 restores per 10 minutes per database
// (D1's limit, objecthost.HistoryConfig.MaxRestores); the generators stay
// under it, counting every attempt and a margin on the window, so no
// restore is ever refused for its rate.
const (
	restoreLimit  = 10
	restoreWindow = 10*time.Minute + 10*time.Second
)

// ReserveRestore takes one of db's restore slots if more than keep are
// left, or reports that there are not (then send none). The generators
// keep a few for the fault steps' restores.
func (c *Client) ReserveRestore(db string, keep int) bool {
	c.restoreMu.Lock()
	defer c.restoreMu.Unlock()
	if c.restores == nil {
		c.restores = map[string][]time.Time{}
	}
	now := time.Now()
	recent := c.restores[db][:0]
	for _, t := range c.restores[db] {
		if now.Sub(t) < restoreWindow {
			recent = append(recent, t)
		}
	}
	if len(recent) >= restoreLimit-keep {
		c.restores[db] = recent
		return false
	}
	c.restores[db] = append(recent, now)
	return true
}

// Bookmark takes db's current time-travel bookmark through edge.
func (c *Client) Bookmark(ctx context.Context, client, edge int, db string) Op {
	call := c.h.Now()
	a := c.do(ctx, edge, http.MethodGet, "/"+db+"/time_travel/bookmark", nil)
	op := Op{Client: client, Kind: Bookmark, DB: db, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text()}
	if op.Outcome == OK {
		var res struct {
			Bookmark string `json:"bookmark"`
		}
		if json.Unmarshal(a.Result, &res) != nil || res.Bookmark == "" {
			op.Outcome, op.Answer = Unknown, "200 without a bookmark: "+a.text()
		}
		op.Bookmark = res.Bookmark
	}
	return c.h.Add(op)
}

// Restore restores db to bookmark through edge (reserve a slot first:
// ReserveRestore).
func (c *Client) Restore(ctx context.Context, client, edge int, db, bookmark string) Op {
	call := c.h.Now()
	a := c.do(ctx, edge, http.MethodPost, "/"+db+"/time_travel/restore?bookmark="+url.QueryEscape(bookmark), nil)
	op := Op{Client: client, Kind: Restore, DB: db, Bookmark: bookmark, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text()}
	if op.Outcome == OK {
		var res struct {
			Bookmark         string `json:"bookmark"`
			PreviousBookmark string `json:"previous_bookmark"`
		}
		if json.Unmarshal(a.Result, &res) != nil || res.Bookmark == "" || res.PreviousBookmark == "" {
			op.Outcome, op.Answer = Unknown, "200 without bookmarks: "+a.text()
		}
		op.Prev, op.After = res.PreviousBookmark, res.Bookmark
	}
	return c.h.Add(op)
}

// FileSize reads db through edge (GET /database/{id}, not recorded): the
// object host measures the database's file (file + WAL) for the answer's
// file_size, and publishes that size when it changed.
func (c *Client) FileSize(ctx context.Context, edge int, db string) (int64, Outcome, string) {
	a := c.do(ctx, edge, http.MethodGet, "/"+db, nil)
	if a.outcome() != OK {
		return 0, a.outcome(), a.text()
	}
	var d struct {
		FileSize int64 `json:"file_size"`
	}
	if err := json.Unmarshal(a.Result, &d); err != nil {
		return 0, Unknown, "file_size: " + a.text()
	}
	return d.FileSize, OK, ""
}

// Probe runs SELECT 1 on db through edge (validation: not recorded): a
// listed database must answer queries.
func (c *Client) Probe(ctx context.Context, edge int, db string) (Outcome, string) {
	a := c.do(ctx, edge, http.MethodPost, "/"+db+"/query", map[string]any{"sql": "SELECT 1 AS one"})
	return a.outcome(), a.text()
}
