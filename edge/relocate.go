package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Lost-host recovery: an object host's disk is gone (or the machine), and
// an operator declares it lost (`shoal cluster host lost HOST`, or
// automatically after it missed its reports for a configured time,
// AutoRecover). Every active database the catalog places on it is then
// recreated on another host from its off-host archive (objecthost/history),
// at its last archived commit, through a create-style flow:
//
//  1. the host is declared lost (set_host_state): placement skips it, and
//     its own registration can no longer make it active;
//  2. per database, placement on an active host of its jurisdiction
//     (prefer its region), and a fresh object ID;
//  3. init on the new host with RestoreFrom = the database's own archive,
//     routing generation + 1: the host restores the last archived state
//     before answering;
//  4. relocate_database — THE CHECKPOINT: a compare-and-set from the lost
//     object to the new one. From here queries go to the new object
//     (edges learn it from the route feed, or from the catalog the first
//     time the lost host refuses a connection, query.go); the lost host,
//     if it returns, retires its superseded objects at their next
//     heartbeat (objecthost/relocated.go);
//  5. confirm to the new object (best effort; its heartbeat confirms it
//     otherwise).
//
// A failure at 3 retries from 2 with a new object ID on another host; the
// object left behind is an orphan (unconfirmed, killed after the creation
// grace). The compare-and-set at 4 makes concurrent recoveries (a rerun,
// two operators, edges in automatic mode) safe: one object wins, the
// others are leftovers their hosts fence and delete. A rerun after a
// crash resumes: it lists what is still placed on the lost host.
//
// What is lost: in the default durability, the commits the lost host had
// not shipped yet (≤ the shipping lag, about 1 s; shoal_history_lag_seconds);
// with durability = "archived", nothing acknowledged. A database with no
// archived history at all is not relocated (it is reported) unless
// EmptyIfNone: on a host that ran with history it was never written, but
// on a host without an archive it would silently become empty.

// RecoveryCatalog is what lost-host recovery needs of the catalog.
// Contract: safe for concurrent use; reads are fresh (linearizable: a
// destructive plan is made only on confirmed answers); writes as in
// raftmeta.CatalogWriter (refusals are fsm's sentinels).
type RecoveryCatalog interface {
	Hosts(ctx context.Context) ([]fsm.Host, error)
	SetHostState(ctx context.Context, s fsm.SetHostState) (fsm.Host, error)
	HostDatabasesPage(ctx context.Context, hostID, after string, limit int) (fsm.HostDatabasesPage, error)
	RelocateDatabase(ctx context.Context, r fsm.RelocateDatabase) (fsm.Database, error)
}

// RecoveryHosts is what lost-host recovery calls on object hosts
// (*HostClient has it).
type RecoveryHosts interface {
	Init(ctx context.Context, addr, objectID string, in InitRequest) (ObjectInfo, error)
	Confirm(ctx context.Context, rt Route) error
}

var _ RecoveryHosts = (*HostClient)(nil)

// RaftmetaRecovery adapts a raftmeta.Client to RecoveryCatalog with
// linearizable reads.
type RaftmetaRecovery struct{ C *raftmeta.Client }

var _ RecoveryCatalog = RaftmetaRecovery{}

func (r RaftmetaRecovery) Hosts(ctx context.Context) ([]fsm.Host, error) {
	return r.C.Hosts(ctx, raftmeta.LinearizableRead())
}

func (r RaftmetaRecovery) SetHostState(ctx context.Context, s fsm.SetHostState) (fsm.Host, error) {
	return r.C.SetHostState(ctx, s)
}

func (r RaftmetaRecovery) HostDatabasesPage(ctx context.Context, hostID, after string, limit int) (fsm.HostDatabasesPage, error) {
	return r.C.HostDatabasesPage(ctx, hostID, after, limit, raftmeta.LinearizableRead())
}

func (r RaftmetaRecovery) RelocateDatabase(ctx context.Context, req fsm.RelocateDatabase) (fsm.Database, error) {
	return r.C.RelocateDatabase(ctx, req)
}

// RecoverOptions tune a recovery.
type RecoverOptions struct {
	// Concurrency is how many databases are restored at once (default 8).
	Concurrency int
	// Attempts per database, each on a fresh object (default 3).
	Attempts int
	// EmptyIfNone relocates databases with no archived history as empty
	// ones (see above); default: they are reported and left.
	EmptyIfNone bool
	// InitTimeout bounds one init (a restore) on a new host (default 5 min).
	InitTimeout time.Duration
	// Progress, when set, is called after each database (from the
	// workers, serialised).
	Progress func(RecoverProgress)
	Logger   *slog.Logger
}

// RecoverProgress is a recovery's progress so far.
type RecoverProgress struct {
	Done, Listed int
	Last         string // the database just handled
	Outcome      string // relocated | already | no_archive | deleted | deleted_on_host | failed
}

// RecoverReport is a recovery's outcome.
type RecoverReport struct {
	Host      string   `json:"host"`
	Listed    int      `json:"listed"`    // active databases placed on the host
	Relocated int      `json:"relocated"` // by this run
	Already   int      `json:"already"`   // moved by a concurrent or earlier run
	Deleted   int      `json:"deleted"`   // deleted meanwhile
	NoArchive []string `json:"no_archive,omitempty"`
	// DeletedOnHost: databases the catalog lists active whose archive
	// holds a delete marker (the lost host deleted them on the catalog's
	// word; a catalog restored from an older backup lists them again).
	// Not revived and left on the lost host in the catalog: deleting them
	// again is the operator's (shoal cluster resurrected explains).
	DeletedOnHost map[string]string `json:"deleted_on_host,omitempty"` // uuid → the host's answer
	Failed        map[string]string `json:"failed,omitempty"`          // uuid → last error
	Elapsed       time.Duration     `json:"elapsed_ns"`
	// Per-database time from the first placement to the checkpoint.
	P50, P99, Max time.Duration
}

// Complete reports whether every listed database left the host.
func (r RecoverReport) Complete() bool {
	return len(r.NoArchive) == 0 && len(r.Failed) == 0 && len(r.DeletedOnHost) == 0
}

// ErrHostNotLost is returned when recovering a host not declared lost.
var ErrHostNotLost = errors.New("host is not declared lost")

// Recoverer runs lost-host recoveries.
type Recoverer struct {
	cat   RecoveryCatalog
	hosts RecoveryHosts
	o     RecoverOptions
}

// NewRecoverer returns a Recoverer.
func NewRecoverer(cat RecoveryCatalog, hosts RecoveryHosts, o RecoverOptions) *Recoverer {
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	if o.InitTimeout <= 0 {
		o.InitTimeout = 5 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Recoverer{cat: cat, hosts: hosts, o: o}
}

// DeclareLost is step 1: the host's state becomes lost. idleSince, when not
// zero, makes it conditional on the host not having reported since (the
// automatic mode's compare-and-set; fsm.ErrConflict otherwise).
func (rc *Recoverer) DeclareLost(ctx context.Context, hostID string, idleSince time.Time) (fsm.Host, error) {
	var ns int64
	if !idleSince.IsZero() {
		ns = idleSince.UnixNano()
	}
	return rc.cat.SetHostState(ctx, fsm.SetHostState{ID: hostID, State: fsm.HostStateLost, IdleSince: ns})
}

// Readmit undoes DeclareLost: the host is active again. Databases already
// relocated stay where they are (its objects for them retire).
func (rc *Recoverer) Readmit(ctx context.Context, hostID string) (fsm.Host, error) {
	return rc.cat.SetHostState(ctx, fsm.SetHostState{ID: hostID, State: fsm.HostStateActive})
}

// Recover runs steps 2–5 for every active database placed on the lost
// host hostID, and reports. It is safe to run again (it resumes) and
// concurrently with other runs.
func (rc *Recoverer) Recover(ctx context.Context, hostID string) (RecoverReport, error) {
	start := time.Now()
	rep := RecoverReport{Host: hostID, Failed: map[string]string{}, DeletedOnHost: map[string]string{}}
	hosts, err := rc.cat.Hosts(ctx)
	if err != nil {
		return rep, fmt.Errorf("read hosts: %w", err)
	}
	var lost *fsm.Host
	var targets []fsm.Host
	for i, h := range hosts {
		switch {
		case h.ID == hostID:
			lost = &hosts[i]
		case h.State == "" || h.State == fsm.HostStateActive:
			targets = append(targets, h)
		}
	}
	if lost == nil {
		return rep, fmt.Errorf("%w: host %q", fsm.ErrNotFound, hostID)
	}
	if lost.State != fsm.HostStateLost {
		return rep, fmt.Errorf("%w: %s is %s (shoal cluster host lost %s declares it)", ErrHostNotLost, hostID, lost.State, hostID)
	}
	if len(targets) == 0 {
		return rep, fmt.Errorf("%w: no active object host to relocate to", ErrUnavailable)
	}

	var (
		mu      sync.Mutex
		pending = map[string]int64{}
		took    []time.Duration
	)
	note := func(uuid, outcome string, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		switch outcome {
		case "relocated":
			rep.Relocated++
			took = append(took, d)
		case "already":
			rep.Already++
		case "deleted":
			rep.Deleted++
		}
		if rc.o.Progress != nil {
			rc.o.Progress(RecoverProgress{Done: rep.Relocated + rep.Already + rep.Deleted + len(rep.NoArchive) + len(rep.DeletedOnHost) + len(rep.Failed), Listed: rep.Listed, Last: uuid, Outcome: outcome})
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	work := make(chan fsm.Database)
	for i := 0; i < rc.o.Concurrency; i++ {
		g.Go(func() error {
			for d := range work {
				t0 := time.Now()
				outcome, err := rc.relocateOne(gctx, d, targets, &mu, pending)
				if err != nil {
					rc.o.Logger.Warn("relocation failed", "database", d.UUID, "host", hostID, "err", err)
					mu.Lock()
					switch outcome {
					case "no_archive":
						rep.NoArchive = append(rep.NoArchive, d.UUID)
					case "deleted_on_host":
						rep.DeletedOnHost[d.UUID] = err.Error()
					default:
						rep.Failed[d.UUID] = err.Error()
					}
					mu.Unlock()
				}
				note(d.UUID, outcome, time.Since(t0))
			}
			return nil
		})
	}
	// The list is read page by page while the workers drain it; relocated
	// databases leave the host, so the keyset (UUID) is what advances.
	var listErr error
	after := ""
	for listErr == nil {
		var page fsm.HostDatabasesPage
		page, listErr = rc.cat.HostDatabasesPage(gctx, hostID, after, 500)
		if listErr != nil {
			break
		}
		mu.Lock()
		rep.Listed += len(page.Databases)
		mu.Unlock()
		for _, d := range page.Databases {
			select {
			case work <- d:
			case <-gctx.Done():
				listErr = gctx.Err()
			}
			if listErr != nil {
				break
			}
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	close(work)
	_ = g.Wait()
	sort.Strings(rep.NoArchive)
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	if n := len(took); n > 0 {
		rep.P50, rep.P99, rep.Max = took[n/2], took[min(n-1, n*99/100)], took[n-1]
	}
	rep.Elapsed = time.Since(start)
	if len(rep.Failed) == 0 {
		rep.Failed = nil
	}
	if len(rep.DeletedOnHost) == 0 {
		rep.DeletedOnHost = nil
	}
	if listErr != nil {
		return rep, fmt.Errorf("list the host's databases: %w", listErr)
	}
	return rep, nil
}

// relocateOne runs steps 2–5 for one database. Its outcome is one of
// RecoverProgress.Outcome's values.
func (rc *Recoverer) relocateOne(ctx context.Context, d fsm.Database, targets []fsm.Host, mu *sync.Mutex, pending map[string]int64) (string, error) {
	exclude := map[string]bool{}
	var lastErr error
	for attempt := 0; attempt < rc.o.Attempts; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return "failed", ctx.Err()
			case <-time.After(100 * time.Millisecond << attempt):
			}
		}
		// (2) Placement and a fresh object.
		mu.Lock()
		target, err := placeAmong(targets, d.Jurisdiction, d.Region, exclude, pending)
		mu.Unlock()
		if err != nil {
			return "failed", err
		}
		objectID := newObjectID()
		// (3) Init from the archive.
		ictx, cancel := context.WithTimeout(ctx, rc.o.InitTimeout)
		_, err = rc.hosts.Init(ictx, target.Address, objectID, InitRequest{
			DatabaseUUID: d.UUID, AccountID: d.AccountID, Name: d.Name, Region: target.Region,
			Jurisdiction: d.Jurisdiction, RoutingGeneration: d.RoutingGeneration + 1,
			RestoreFrom: &RestoreSource{DatabaseUUID: d.UUID, EmptyIfNone: rc.o.EmptyIfNone},
		})
		cancel()
		if err != nil {
			var he *HostError
			if errors.As(err, &he) && he.Status == http.StatusBadRequest && strings.Contains(he.Message, "no archived history") {
				return "no_archive", fmt.Errorf("no archived history: %s", he.Message)
			}
			if errors.As(err, &he) && he.Status == http.StatusBadRequest && strings.Contains(he.Message, "can no longer be restored") {
				// The archive lost or damaged what the newest point needs
				// (objecthost/restoredamage.go): every host reads the same
				// archive, so no other one would do better. The operator
				// decides (the message names the newest point that
				// restores).
				return "failed", fmt.Errorf("archive damaged: %s", he.Message)
			}
			if errors.As(err, &he) && he.Status == http.StatusGone && strings.Contains(he.Message, "deleted on its host") {
				// The archive holds the database's delete marker
				// (objecthost/deletemark.go): a zombie of a restored
				// catalog. Never revived, never deleted here: reported.
				return "deleted_on_host", errors.New(he.Message)
			}
			lastErr = fmt.Errorf("init on %s: %w", target.ID, err)
			exclude[target.ID] = true
			continue
		}
		// (4) THE CHECKPOINT. An unknown outcome is retried with the same
		// IDs (the command is idempotent for the object it names).
		var moved fsm.Database
		for try := 0; try < 3; try++ {
			moved, err = rc.cat.RelocateDatabase(ctx, fsm.RelocateDatabase{UUID: d.UUID, FromObjectID: d.ObjectID, ObjectID: objectID, HostID: target.ID})
			if err == nil || fsm.IsRefusal(err) || ctx.Err() != nil {
				break
			}
		}
		switch {
		case err == nil:
			// (5) Best effort.
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if cerr := rc.hosts.Confirm(cctx, routeOf(moved)); cerr != nil {
				rc.o.Logger.Info("confirm of a relocated database failed; its heartbeat confirms it", "database", d.UUID, "err", cerr)
			}
			cancel()
			return "relocated", nil
		case errors.Is(err, fsm.ErrConflict):
			return "already", nil // another run moved it; our object is a leftover
		case errors.Is(err, fsm.ErrNotFound):
			return "deleted", nil
		case errors.Is(err, fsm.ErrExists):
			lastErr = err // our object was fenced as a leftover: new IDs
			continue
		default:
			lastErr = fmt.Errorf("relocate in the catalog: %w", err)
		}
	}
	return "failed", lastErr
}

// AutoOptions configure AutoRecover.
type AutoOptions struct {
	// After is how long a host must have gone without registering or
	// reporting its load (every 10 s by default) before it is declared
	// lost. At least one minute; 0 disables (the default: declaring a
	// host lost is an operator's decision unless configured).
	After time.Duration
	// Interval between checks (default 30 s).
	Interval time.Duration
	Now      func() time.Time // default time.Now
}

// AutoRecover declares lost, and recovers, a host silent for longer than
// o.After, until ctx ends. Safety:
//   - the decision is made on a linearizable read of the hosts, and the
//     declaration is a compare-and-set on the host's last report (a host
//     that reported in between is not declared lost);
//   - at most one host at a time: two or more silent hosts at once look
//     like a partition or a catalog problem, not a dead machine — a mass
//     of destructive decisions, so nothing is declared and an error is
//     logged every check until an operator acts;
//   - a host declared lost whose databases are not all relocated (a
//     recovery interrupted by a crash) is resumed at every check.
//
// Several edges may run it: the catalog's compare-and-sets make them
// agree, at the cost of leftovers that their hosts kill.
func (rc *Recoverer) AutoRecover(ctx context.Context, o AutoOptions) {
	if o.After <= 0 {
		return
	}
	if o.After < time.Minute {
		o.After = time.Minute
	}
	if o.Interval <= 0 {
		o.Interval = 30 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		rc.autoCheck(ctx, o)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// autoCheck is one check of AutoRecover; it returns what it did, for tests.
func (rc *Recoverer) autoCheck(ctx context.Context, o AutoOptions) string {
	hosts, err := rc.cat.Hosts(ctx)
	if err != nil {
		rc.o.Logger.Warn("lost-host check: hosts unreadable", "err", err)
		return "error"
	}
	bound := o.Now().Add(-o.After)
	var silent, lost []fsm.Host
	active := 0
	for _, h := range hosts {
		switch h.State {
		case fsm.HostStateLost:
			lost = append(lost, h)
		case "", fsm.HostStateActive:
			active++
			if time.Unix(0, h.UpdatedAt).Before(bound) {
				silent = append(silent, h)
			}
		}
	}
	for _, h := range lost { // resume interrupted recoveries
		page, err := rc.cat.HostDatabasesPage(ctx, h.ID, "", 1)
		if err != nil || len(page.Databases) == 0 {
			continue
		}
		rc.run(ctx, h.ID, "resumed")
	}
	switch {
	case len(silent) == 0:
		return "none"
	case len(silent) > 1 || len(silent) >= active:
		ids := make([]string, 0, len(silent))
		for _, h := range silent {
			ids = append(ids, h.ID)
		}
		rc.o.Logger.Error("lost-host check: several object hosts are silent at once; declaring none lost (a partition or a catalog problem looks like this; `shoal cluster host lost` acts on one host if it is really gone)",
			"silent", ids, "active", active, "after", o.After)
		return "brake"
	}
	h := silent[0]
	if _, err := rc.DeclareLost(ctx, h.ID, bound); err != nil {
		rc.o.Logger.Warn("lost-host check: declaring the host lost failed", "host", h.ID, "err", err)
		return "error"
	}
	rc.o.Logger.Error("object host declared lost: no report for longer than the configured bound; relocating its databases from the archive",
		"host", h.ID, "last_report", time.Unix(0, h.UpdatedAt).UTC(), "after", o.After)
	rc.run(ctx, h.ID, "declared")
	return "declared"
}

func (rc *Recoverer) run(ctx context.Context, hostID, why string) {
	rep, err := rc.Recover(ctx, hostID)
	rc.o.Logger.Info("lost-host recovery", "host", hostID, "why", why, "listed", rep.Listed, "relocated", rep.Relocated,
		"already", rep.Already, "no_archive", len(rep.NoArchive), "failed", len(rep.Failed), "elapsed", rep.Elapsed, "err", err)
}
