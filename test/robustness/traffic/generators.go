package traffic

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Config sizes a load. Every random choice comes from Seed: two runs with the
// same seed make the same choices (the system's answers and timing differ).
type Config struct {
	Seed        uint64
	Creators    int           // clients creating databases (each seeds its table t)
	DeleteEvery int           // each creator deletes every n-th database it created (0: never)
	RowWriters  int           // clients inserting unique values into live databases
	Getters     int           // clients reading databases at the edge and the linearizable level
	Registers   []string      // register databases (SetupRegisters)
	RegClients  int           // clients per register, each mixing writes and reads
	Pace        time.Duration // pause between a client's operations
	// TimeTravel adds one client per register that takes the database's
	// bookmark about every BookmarkEvery and restores it to one of the
	// bookmarks it knows (taken, or named by an earlier restore's answer)
	// about every RestoreEvery, within the hosts' restore limit
	// (Client.ReserveRestore). Needs hosts with history.
	TimeTravel    bool
	BookmarkEvery time.Duration
	RestoreEvery  time.Duration
	// Listers list the account's databases at the linearizable level
	// (Client.LinList) every ListEvery each.
	Listers   int
	ListEvery time.Duration
	// Limited are free-tier accounts with a low daily rows-written limit:
	// one writer each inserts unique values into their databases at Pace,
	// whatever the answers (it goes on after the account is refused: the
	// refusals are what validate.LimitEnforced judges).
	Limited []LimitedAccount
	// ExportEvery, ImportEvery and InsightsEvery add one client each
	// (0: none), pausing about that long between its operations: the
	// exporter exports a live database (Client.Export), the importer
	// creates a fresh database, then imports a dump of ImportRows rows
	// into it and reads them back (Client.Import, Client.ImportRead),
	// and the insights client asks a live database's query insights
	// (Client.Insights). A modest rate: the other checks keep their
	// volume.
	ExportEvery   time.Duration
	ImportEvery   time.Duration
	ImportRows    int
	InsightsEvery time.Duration
}

// LimitedAccount is one free-tier account of the limiter's traffic: its
// client (its own account and token, recording into the same History) and
// its databases, each with a table t (SetupLimited).
type LimitedAccount struct {
	Client *Client
	DBs    []string
}

// Load runs the generators of a Config until its context ends.
type Load struct {
	c   *Client
	cfg Config

	value atomic.Int64 // unique values for inserts and register writes

	mu        sync.Mutex
	live      []string            // acknowledged, table created, never deleted
	bookmarks map[string][]string // per register, bookmarks the API gave
	avoid     atomic.Int64        // 1 + an edge the generators keep off (AvoidEdge); 0: none
}

// AvoidEdge keeps the generators off edge i (0-based) until AvoidEdge(-1):
// e.g. while it is restarted cold with the catalog cut off, when it cannot
// check an API token (tokens live in the catalog), by design.
func (l *Load) AvoidEdge(i int) { l.avoid.Store(int64(i + 1)) }

// NewLoad prepares cfg's generators on c.
func NewLoad(c *Client, cfg Config) *Load { return &Load{c: c, cfg: cfg} }

// Run runs every generator until ctx ends and returns when all have.
func (l *Load) Run(ctx context.Context) {
	var wg sync.WaitGroup
	id := 0
	spawn := func(n int, fn func(ctx context.Context, client int, r *rand.Rand)) {
		for range n {
			id++
			client, r := id, rand.New(rand.NewPCG(l.cfg.Seed, uint64(id)))
			wg.Add(1)
			go func() { defer wg.Done(); fn(ctx, client, r) }()
		}
	}
	spawn(l.cfg.Creators, l.creator)
	spawn(l.cfg.RowWriters, l.rowWriter)
	spawn(l.cfg.Getters, l.getter)
	for _, db := range l.cfg.Registers {
		spawn(l.cfg.RegClients, func(ctx context.Context, client int, r *rand.Rand) { l.register(ctx, client, r, db) })
	}
	if l.cfg.TimeTravel {
		for _, db := range l.cfg.Registers {
			spawn(1, func(ctx context.Context, client int, r *rand.Rand) { l.timeTraveller(ctx, client, r, db) })
		}
	}
	spawn(l.cfg.Listers, l.lister)
	for _, la := range l.cfg.Limited {
		spawn(1, func(ctx context.Context, client int, r *rand.Rand) { l.limitWriter(ctx, client, r, la) })
	}
	if l.cfg.ExportEvery > 0 {
		spawn(1, l.exporter)
	}
	if l.cfg.ImportEvery > 0 {
		spawn(1, l.importer)
	}
	if l.cfg.InsightsEvery > 0 {
		spawn(1, l.insighter)
	}
	wg.Wait()
}

// lister lists the account's databases at the linearizable level.
func (l *Load) lister(ctx context.Context, client int, r *rand.Rand) {
	for ctx.Err() == nil {
		l.c.LinList(ctx, client)
		l.pause(ctx, l.cfg.ListEvery/2+time.Duration(r.Int64N(int64(l.cfg.ListEvery)+1)))
	}
}

// limitWriter inserts unique values into a limited account's databases,
// one after the other, until ctx ends.
func (l *Load) limitWriter(ctx context.Context, client int, r *rand.Rand, la LimitedAccount) {
	for i := 0; ctx.Err() == nil; i++ {
		la.Client.FreeInsert(ctx, client, l.edge(r), la.DBs[i%len(la.DBs)], l.value.Add(1))
		l.pause(ctx, l.cfg.Pace)
	}
}

// NextValue is a value no generator has written or will write.
func (l *Load) NextValue() int64 { return l.value.Add(1) }

// AddBookmarks remembers bookmarks of register db the API gave (a
// bookmark's answer, a restore's previous and new bookmarks).
func (l *Load) AddBookmarks(db string, bms ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bookmarks == nil {
		l.bookmarks = map[string][]string{}
	}
	for _, b := range bms {
		if b != "" {
			l.bookmarks[db] = append(l.bookmarks[db], b)
		}
	}
}

// recentBookmarks is how many of a database's latest bookmarks a restore
// chooses from: a bookmark stays in the register model's state from when
// it is taken to its last restore, and a short span keeps the states
// porcupine must tell apart few.
const recentBookmarks = 4

// PickBookmark is one of db's latest known bookmarks, chosen by r.
func (l *Load) PickBookmark(r *rand.Rand, db string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	bs := l.bookmarks[db]
	if len(bs) == 0 {
		return "", false
	}
	bs = bs[max(0, len(bs)-recentBookmarks):]
	return bs[r.IntN(len(bs))], true
}

// restoreKeep is how many of each database's restore slots the generator
// leaves to the fault steps (restores during a host kill).
const restoreKeep = 3

// timeTraveller takes bookmarks of register db and now and then restores
// it to one of them (Config.TimeTravel).
func (l *Load) timeTraveller(ctx context.Context, client int, r *rand.Rand, db string) {
	jitter := func(d time.Duration) time.Duration { return d/2 + time.Duration(r.Int64N(int64(d)+1)) }
	nextRestore := time.Now().Add(jitter(l.cfg.RestoreEvery))
	for ctx.Err() == nil {
		l.pause(ctx, jitter(l.cfg.BookmarkEvery))
		if ctx.Err() != nil {
			return
		}
		if time.Now().After(nextRestore) {
			nextRestore = time.Now().Add(jitter(l.cfg.RestoreEvery))
			if bm, ok := l.PickBookmark(r, db); ok && l.c.ReserveRestore(db, restoreKeep) {
				if op := l.c.Restore(ctx, client, l.edge(r), db, bm); op.Outcome == OK {
					l.AddBookmarks(db, op.Prev, op.After)
				}
				continue
			}
		}
		if op := l.c.Bookmark(ctx, client, l.edge(r), db); op.Outcome == OK {
			l.AddBookmarks(db, op.Bookmark)
		}
	}
}

// Live is the databases the load created and never deleted, their table made.
func (l *Load) Live() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.live...)
}

// Drop takes db off the live databases the generators write to and read
// (e.g. before a scenario step deletes it).
func (l *Load) Drop(db string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, d := range l.live {
		if d == db {
			l.live = append(l.live[:i], l.live[i+1:]...)
			return
		}
	}
}

func (l *Load) pick(r *rand.Rand) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.live) == 0 {
		return "", false
	}
	return l.live[r.IntN(len(l.live))], true
}

func (l *Load) pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (l *Load) edge(r *rand.Rand) int {
	n := l.c.Edges()
	i := r.IntN(n)
	if a := int(l.avoid.Load()) - 1; a == i && n > 1 {
		i = (i + 1 + r.IntN(n-1)) % n
	}
	return i
}

// creator creates databases; each acknowledged one gets its table t and a
// first row, and every DeleteEvery-th is deleted instead.
func (l *Load) creator(ctx context.Context, client int, r *rand.Rand) {
	for i := 0; ctx.Err() == nil; i++ {
		op := l.c.Create(ctx, client, l.edge(r), fmt.Sprintf("c%d-%d", client, i))
		if op.Outcome == OK {
			if l.cfg.DeleteEvery > 0 && i%l.cfg.DeleteEvery == l.cfg.DeleteEvery-1 {
				l.c.Delete(ctx, client, l.edge(r), op.DB)
			} else if l.c.Exec(ctx, l.edge(r), op.DB, "CREATE TABLE IF NOT EXISTS t (v INTEGER PRIMARY KEY)") == nil {
				l.c.Insert(ctx, client, l.edge(r), op.DB, l.value.Add(1))
				l.mu.Lock()
				l.live = append(l.live, op.DB)
				l.mu.Unlock()
			}
		}
		l.pause(ctx, l.cfg.Pace)
	}
}

func (l *Load) rowWriter(ctx context.Context, client int, r *rand.Rand) {
	for ctx.Err() == nil {
		if db, ok := l.pick(r); ok {
			l.c.Insert(ctx, client, l.edge(r), db, l.value.Add(1))
		}
		l.pause(ctx, l.cfg.Pace)
	}
}

func (l *Load) getter(ctx context.Context, client int, r *rand.Rand) {
	for ctx.Err() == nil {
		if db, ok := l.pick(r); ok {
			l.c.EdgeGet(ctx, client, l.edge(r), db)
			l.c.LinGet(ctx, client, db)
		}
		l.pause(ctx, l.cfg.Pace)
	}
}

// register mixes writes of unique values and reads on one register. After
// an answer of unknown outcome it backs off: each such write stays open in
// the history until the end, and many open writes make the check slow.
func (l *Load) register(ctx context.Context, client int, r *rand.Rand, db string) {
	for ctx.Err() == nil {
		var op Op
		if r.IntN(2) == 0 {
			op = l.c.RegWrite(ctx, client, l.edge(r), db, l.value.Add(1))
		} else {
			op = l.c.RegRead(ctx, client, l.edge(r), db)
		}
		if op.Outcome != OK {
			l.pause(ctx, 10*l.cfg.Pace)
		}
		l.pause(ctx, l.cfg.Pace)
	}
}

// SetupLimited creates n databases of c's account, each with table t,
// retrying transient failures, and returns them with the rows their
// set-up wrote (meta.rows_written of the acknowledged answers) and how many
// set-up requests were not acknowledged (each may have written rows too).
func SetupLimited(ctx context.Context, c *Client, n int) (dbs []string, rows int64, unacked int, err error) {
	for i := range n {
		var db string
		err = retry(ctx, 30*time.Second, func() error {
			if db == "" {
				op := c.CreateUnrecorded(ctx, i%c.Edges(), fmt.Sprintf("free-%d", i))
				if op.Outcome != OK {
					return fmt.Errorf("create limited database %d: %s", i, op.Answer)
				}
				db = op.DB
			}
			w, err := c.ExecRows(ctx, i%c.Edges(), db, "CREATE TABLE IF NOT EXISTS t (v INTEGER PRIMARY KEY)")
			if err != nil {
				unacked++
				return err
			}
			rows += w
			return nil
		})
		if err != nil {
			return dbs, rows, unacked, err
		}
		dbs = append(dbs, db)
	}
	return dbs, rows, unacked, nil
}

// SetupRegisters creates n register databases (table reg, one row k = 0,
// v = 0), retrying transient failures; they exist before any fault.
func SetupRegisters(ctx context.Context, c *Client, n int) ([]string, error) {
	var out []string
	for i := range n {
		var db string
		err := retry(ctx, 30*time.Second, func() error {
			if db == "" {
				op := c.Create(ctx, 0, i%c.Edges(), fmt.Sprintf("reg-%d", i))
				if op.Outcome != OK {
					return fmt.Errorf("create register %d: %s", i, op.Answer)
				}
				db = op.DB
			}
			return c.Exec(ctx, i%c.Edges(), db,
				"CREATE TABLE IF NOT EXISTS reg (k INTEGER PRIMARY KEY, v INTEGER NOT NULL)",
				"INSERT OR IGNORE INTO reg (k, v) VALUES (0, 0)")
		})
		if err != nil {
			return out, err
		}
		out = append(out, db)
	}
	return out, nil
}

// jitter is d/2 to 3d/2, chosen by r.
func jitter(r *rand.Rand, d time.Duration) time.Duration {
	return d/2 + time.Duration(r.Int64N(int64(d)+1))
}

// exporter exports a live database about every ExportEvery.
func (l *Load) exporter(ctx context.Context, client int, r *rand.Rand) {
	for ctx.Err() == nil {
		l.pause(ctx, jitter(r, l.cfg.ExportEvery))
		if db, ok := l.pick(r); ok && ctx.Err() == nil {
			l.c.Export(ctx, client, l.edge(r), db)
		}
	}
}

// insighter asks a live database's insights about every InsightsEvery.
func (l *Load) insighter(ctx context.Context, client int, r *rand.Rand) {
	for ctx.Err() == nil {
		l.pause(ctx, jitter(r, l.cfg.InsightsEvery))
		if db, ok := l.pick(r); ok && ctx.Err() == nil {
			l.c.Insights(ctx, client, l.edge(r), db)
		}
	}
}

// importReadFor bounds the read-back after an import: retried while its
// outcome is unknown (a fault in progress), then given up.
const importReadFor = 10 * time.Second

// importer creates a fresh database, then (a pause later, so that the
// import can fall in a fault the create could not pass, e.g. a catalog
// cut-off) imports ImportRows unique values into its table imp and reads
// them back. The databases are not the load's live ones (no table t).
func (l *Load) importer(ctx context.Context, client int, r *rand.Rand) {
	rows := max(1, l.cfg.ImportRows)
	next := ""
	for i := 0; ctx.Err() == nil; i++ {
		l.pause(ctx, jitter(r, l.cfg.ImportEvery))
		if ctx.Err() != nil {
			return
		}
		if next == "" {
			if op := l.c.Create(ctx, client, l.edge(r), fmt.Sprintf("imp%d-%d", client, i)); op.Outcome == OK {
				next = op.DB
			}
			continue
		}
		vals := make([]int64, rows)
		for j := range vals {
			vals[j] = l.value.Add(1)
		}
		l.c.Import(ctx, client, func() int { return l.edge(r) }, next, vals)
		deadline := time.Now().Add(importReadFor)
		for ctx.Err() == nil {
			if rd := l.c.ImportRead(ctx, client, l.edge(r), next); rd.Outcome != Unknown || time.Now().After(deadline) {
				break
			}
			l.pause(ctx, 200*time.Millisecond)
		}
		next = ""
	}
}
