package history

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// CaptureOptions tune one database's capture.
type CaptureOptions struct {
	// StagingDir is the root of the local staging area (on the host's data
	// disk; it survives restarts). Required.
	StagingDir string
	// CheckpointFrames: the capturer checkpoints the WAL once it holds this
	// many frames (default 1000, SQLite's own autocheckpoint).
	CheckpointFrames int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// WaitArchived, when set, is the opt-in `durability = "archived"` mode:
	// Committed calls it after capturing a transaction, and the
	// transaction's requests are acknowledged only once it returned nil
	// (Shipper.WaitArchived: seal and Put now). Group commit shares one
	// wait among the requests of a group. An error fails the requests with
	// CodeUnavailable: their transaction is committed on the host and will
	// be archived when the store is back, but it was not acknowledged as
	// archived.
	WaitArchived func(c *Capturer) error
	// OnAppend is called (writer goroutine, must not block) when records
	// were appended to a log that had nothing unshipped: the Shipper uses it
	// to learn that a database has work (Shipper.Notify).
	OnAppend func(c *Capturer)
}

// Capturer captures one database's committed transactions into its local
// staging log. It is the sqlexec.CommitHook of that database.
//
// Lifecycle: NewCapturer (before sqlexec.Open: it finishes a restore that a
// crash interrupted), Attach (right after Open), Flush (before
// sqlexec.DB.Close), Close (after it). Committed is called by sqlexec on the
// writer goroutine only; Snapshot and the shipper's calls may come from any
// goroutine.
type Capturer struct {
	key    string
	dbPath string
	opts   CaptureOptions
	log    *localLog

	// Writer goroutine only (or under the attach transaction).
	walF, dbF    *os.File
	pageSize     int
	pos          walPos
	restartOK    bool // the WAL at pos was fully checkpointed: a new salt is expected
	last         recordHeader
	framesAtCk   uint32 // pos.Frames at which the last checkpoint ran
	hdr          walHeader
	hdrOK        bool   // hdr is the WAL header for pos's salts
	limit        int    // SQLite's mxFrame after the commit being captured (-1: unknown, verify)
	archivedTxid uint64 // WaitArchived confirmed up to here
	buf          []byte

	// cur is the last captured position, published for other goroutines.
	curMu sync.Mutex
	cur   published

	// ckptMu is held while a snapshot reads the database file: the writer
	// only checkpoints when it can TryLock it.
	ckptMu       sync.Mutex
	closing      bool // under ckptMu: set by Flush, no snapshot after it
	wantCkpt     atomic.Bool
	captureErr   atomic.Pointer[error]
	bytesSince   atomic.Int64 // record bytes since the last snapshot
	snapTxid     atomic.Uint64
	snapTimeUs   atomic.Int64
	appendedRecs atomic.Int64
	appendedB    atomic.Int64
	checkpoints  atomic.Int64 // full checkpoints
	walRestarts  atomic.Int64 // new WAL salts followed
	generations  atomic.Int64 // generations started by this capturer
	genReason    string       // why the last one was started (writer goroutine)
	retired      atomic.Bool  // closed; the shipper drops it once shipped
	recovered    *recovered   // staging state read by NewCapturer, used once by attach
	syncing      atomic.Bool  // a background fsync of the staging file runs
	syncWG       sync.WaitGroup
}

// CaptureStats are counters of one capturer since NewCapturer.
type CaptureStats struct {
	Records, RecordBytes, FullCheckpoints, WALRestarts, Generations int64
}

// Stats returns the capturer's counters.
func (c *Capturer) Stats() CaptureStats {
	return CaptureStats{c.appendedRecs.Load(), c.appendedB.Load(), c.checkpoints.Load(), c.walRestarts.Load(), c.generations.Load()}
}

type published struct {
	gen       string
	last      recordHeader
	pos       walPos
	restartOK bool
	pageSize  int
}

// NewCapturer prepares the capture of the database file dbPath whose
// archive key is key (the database UUID).
func NewCapturer(key, dbPath string, opts CaptureOptions) (*Capturer, error) {
	if !validKey(key) {
		return nil, fmt.Errorf("history: invalid database key %q", key)
	}
	if opts.StagingDir == "" {
		return nil, errors.New("history: StagingDir is required")
	}
	if opts.CheckpointFrames <= 0 {
		opts.CheckpointFrames = 1000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	l, err := openLocalLog(opts.StagingDir, key)
	if err != nil {
		return nil, err
	}
	c := &Capturer{key: key, dbPath: dbPath, opts: opts, log: l, limit: -1}
	if dbPath == "" {
		return c, nil // staging only (SealForShipping): no file to finish a restore into
	}
	if err := c.finishRestore(); err != nil {
		return nil, err
	}
	return c, nil
}

// Key is the database's archive key.
func (c *Capturer) Key() string { return c.key }

// Attach recovers the staging log, proves continuity with the WAL (or
// starts a new generation with a snapshot), captures what a crash left
// uncaptured, and installs c as db's commit hook.
func (c *Capturer) Attach(ctx context.Context, db *sqlexec.DB) error {
	return db.SetCommitHook(ctx, c, c.attach)
}

func (c *Capturer) attach(w sqlexec.HookConn) error {
	var err error
	if c.dbF, err = os.Open(c.dbPath); err != nil {
		return fmt.Errorf("history: open database file: %w", err)
	}
	// The WAL exists once the writer set journal_mode=WAL (persistent WAL).
	if c.walF, err = os.Open(c.dbPath + "-wal"); err != nil {
		return fmt.Errorf("history: open wal: %w", err)
	}
	var st tip
	var ok bool
	if r := c.recovered; r != nil {
		st, ok, c.recovered = r.st, r.ok, nil // read by NewCapturer just now
	} else if st, ok, err = c.log.recover(); err != nil {
		return err
	}
	h, walOK, err := readWALHeader(c.walF)
	if err != nil {
		return err
	}
	continuous := false
	c.genReason = "no local history"
	if ok {
		c.last = st.Last
		switch {
		case !walOK:
			// Empty WAL: everything is in the database file.
			continuous = st.Settled
			c.pos, c.restartOK = walPos{}, true
		case h.salt1 == st.Last.WAL.Salt1 && h.salt2 == st.Last.WAL.Salt2:
			c0, c1, found, err := frameChecksumAt(c.walF, h, st.Last.WAL.Frames)
			if err != nil {
				return err
			}
			continuous = found && c0 == st.Last.WAL.Ck0 && c1 == st.Last.WAL.Ck1
			c.pos = st.Last.WAL
		default:
			// A new WAL. SQLite restarts a WAL only once every frame of
			// the old one is in the database file, and then sets salt1 to
			// the old salt1 + 1. The capturer checkpoints only right after
			// capturing everything (maybeCheckpoint, its records fsynced
			// first) and nothing can commit between a crash and this
			// attach, so "old salt1 + 1" means every frame of the old WAL
			// up to our last record was captured and the new WAL's frames
			// all come after it.
			continuous = st.Settled || st.Last.WAL.Frames > 0 && h.salt1 == st.Last.WAL.Salt1+1
			c.pos, c.restartOK = walStart(h), false
		}
	}
	if !continuous {
		if ok {
			c.genReason = fmt.Sprintf("cannot prove continuity: tip %+v settled=%v, wal header ok=%v salts %x/%x", st.Last.WAL, st.Settled, walOK, h.salt1, h.salt2)
		}
		return c.newGeneration(st.Last.TimeUs)
	}
	c.publish(st.Gen)
	if walOK {
		// Catch up: commits that a crash left in the WAL uncaptured
		// (c.limit is -1 here: every checksum is verified).
		if err := c.capture(h); err != nil {
			return err
		}
	}
	return nil
}

// newGeneration starts a generation whose base snapshot is the database as
// it is now (writer goroutine: nothing commits or checkpoints meanwhile).
func (c *Capturer) newGeneration(afterUs int64) error {
	h, walOK, err := readWALHeader(c.walF)
	if err != nil {
		return err
	}
	ps, pages, err := dbFileInfo(c.dbF)
	if err != nil {
		return err
	}
	pos := walPos{}
	if walOK {
		ps = h.pageSize
		pos = walStart(h)
		pos, err = scanWAL(c.walF, h, pos, true, -1, &c.buf, func(tx *walTx) error {
			pages = tx.dbSize
			return nil
		})
		if err != nil {
			return err
		}
	}
	if ps == 0 {
		ps = 4096
	}
	im, err := newDBImage(c.dbF, c.walF, h, walOK, pos, ps)
	if err != nil {
		return err
	}
	startUs := c.opts.Now().UnixMicro()
	if startUs <= afterUs {
		startUs = afterUs + 1
	}
	gen := genID(startUs)
	base := snapHeader{PageSize: uint32(ps), DBSize: pages, Txid: 0, TimeUs: startUs}
	last := recordHeader{PageSize: uint32(ps), DBSize: pages, TimeUs: startUs, WAL: pos}
	if err := c.log.startGeneration(gen, base, func(f *os.File) error {
		return writeSnapshot(f, base, im.readPage)
	}, tip{Last: last, Settled: !walOK}); err != nil {
		return fmt.Errorf("history: start generation: %w", err)
	}
	c.pageSize, c.pos, c.last, c.restartOK = ps, pos, last, !walOK
	c.framesAtCk = 0
	c.bytesSince.Store(0)
	c.snapTxid.Store(0)
	c.snapTimeUs.Store(startUs)
	c.generations.Add(1)
	c.publish(gen)
	return nil
}

// Committed captures the transactions committed since the last call
// (sqlexec.CommitHook). It never fails the requests: a capture error is
// kept (Err) and the next commit retries from the same WAL position, since
// nothing checkpoints frames that were not captured.
func (c *Capturer) Committed(w sqlexec.HookConn) error {
	// Never read past SQLite's last committed frame (see scanWAL).
	c.limit = w.WALFrames()
	defer func() { c.limit = -1 }()
	var err error
	progressed := false
	if c.hdrOK && c.hdr.salt1 == c.pos.Salt1 && c.hdr.salt2 == c.pos.Salt2 {
		// Fast path: the header is unchanged unless the WAL restarted, in
		// which case the frames at pos are not valid and nothing is found.
		before := c.last.Txid
		err = c.capture(c.hdr)
		progressed = c.last.Txid != before
	}
	if err == nil && !progressed {
		h, walOK, herr := readWALHeader(c.walF)
		err = herr
		if err == nil && walOK {
			c.hdr, c.hdrOK = h, true
			if c.limit >= 0 && uint32(c.limit) < c.pos.Frames && h.salt1 == c.pos.Salt1 && h.salt2 == c.pos.Salt2 {
				// SQLite's WAL ends before frames we captured: its recovery
				// dropped them (an OS crash lost WAL writes our log kept).
				// The log is ahead of the database: start over from it.
				c.genReason = "the wal ends before the captured position"
				err = c.newGeneration(c.last.TimeUs)
			} else {
				err = c.capture(h)
			}
		}
	}
	if err != nil {
		c.captureErr.Store(&err)
		return nil
	}
	c.captureErr.Store(nil)
	c.maybeCheckpoint(w)
	if c.opts.WaitArchived != nil && c.last.Txid != c.archivedTxid {
		if err := c.opts.WaitArchived(c); err != nil {
			return &sqlexec.Error{Code: v4.CodeUnavailable, Statement: -1,
				Message: "the write is committed on the host but the archive store did not confirm it (durability = archived); it will be archived when the store is back"}
		}
		c.archivedTxid = c.last.Txid
	}
	return nil
}

// capture appends a record for each transaction in the WAL after c.pos.
func (c *Capturer) capture(h walHeader) error {
	if h.salt1 != c.pos.Salt1 || h.salt2 != c.pos.Salt2 {
		if !c.restartOK {
			// The WAL was restarted under frames we never captured: only a
			// checkpoint we did not run can do that. History cannot prove
			// continuity: start over from the database as it is.
			c.genReason = "wal restarted under uncaptured frames"
			return c.newGeneration(c.last.TimeUs)
		}
		c.pos = walStart(h)
		c.framesAtCk = 0
		c.walRestarts.Add(1)
	}
	c.pageSize = h.pageSize
	appended, dirty := false, false
	pos, err := scanWAL(c.walF, h, c.pos, false, c.limit, &c.buf, func(tx *walTx) error {
		t := c.opts.Now().UnixMicro()
		if t <= c.last.TimeUs {
			t = c.last.TimeUs + 1 // strictly increasing: bookmarks sort
		}
		rh := recordHeader{PageSize: uint32(h.pageSize), DBSize: tx.dbSize, PrevCRC: c.last.CRC, Txid: c.last.Txid + 1, TimeUs: t, WAL: tx.end}
		rh, n, became, err := c.log.append(rh, tx.pages)
		if err != nil {
			return fmt.Errorf("history: append: %w", err)
		}
		if became {
			dirty = true
		}
		c.last, c.pos, c.restartOK = rh, tx.end, false
		c.bytesSince.Add(n)
		c.appendedRecs.Add(1)
		c.appendedB.Add(n)
		appended = true
		return nil
	})
	c.pos = pos
	if appended {
		c.publish("")
		if dirty && c.opts.OnAppend != nil {
			c.opts.OnAppend(c)
		}
	}
	return err
}

// maybeCheckpoint checkpoints the WAL when it has grown past
// CheckpointFrames (or a snapshot asked for it), after fsyncing the
// staging file that holds its frames' records: once SQLite restarts the
// WAL those frames exist only there. That fsync is on the write path (the
// checkpoint backfills up to the newest commit, so its record must be
// durable too), but short: at 3/4 of the way a background fsync already
// writes most of the bytes out.
func (c *Capturer) maybeCheckpoint(w sqlexec.HookConn) {
	frames := int(c.pos.Frames - c.framesAtCk)
	if frames < c.opts.CheckpointFrames && !c.wantCkpt.Load() {
		if frames >= c.opts.CheckpointFrames*3/4 && c.log.synced.Load() < c.last.Txid {
			c.syncInBackground()
		}
		return
	}
	if !c.ckptMu.TryLock() {
		return // a snapshot is reading the database file; next commit
	}
	defer c.ckptMu.Unlock()
	if c.log.synced.Load() < c.last.Txid {
		if err := c.log.sync(); err != nil {
			c.captureErr.Store(&err)
			return
		}
	}
	nlog, nckpt, err := w.Checkpoint()
	if err != nil {
		c.captureErr.Store(&err)
		return
	}
	c.framesAtCk = c.pos.Frames
	c.wantCkpt.Store(false)
	if nlog == nckpt && uint32(nlog) == c.pos.Frames {
		// The database file holds everything: SQLite may restart the WAL
		// at the next write (salt1 + 1, which is how the next attach
		// recognises that restart; no tip needs writing here).
		c.restartOK = true
		c.checkpoints.Add(1)
		c.publish("")
	}
}

func (c *Capturer) publish(gen string) {
	c.curMu.Lock()
	if gen != "" {
		c.cur.gen = gen
	}
	c.cur.last, c.cur.pos, c.cur.restartOK, c.cur.pageSize = c.last, c.pos, c.restartOK, c.pageSize
	c.curMu.Unlock()
}

// Current is the position of the last captured commit (the database's
// current bookmark).
func (c *Capturer) Current() Position {
	c.curMu.Lock()
	defer c.curMu.Unlock()
	return Position{Gen: c.cur.gen, Txid: c.cur.last.Txid, TimeUs: c.cur.last.TimeUs}
}

// Err is the last capture error, nil once a later capture succeeded.
func (c *Capturer) Err() error {
	if p := c.captureErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Flush makes the staging log durable and marks it settled, so that the
// checkpoint sqlexec.DB.Close does is expected at the next attach. Call it
// after the last write and before Close; it fails if a capture failed (the
// WAL then holds commits the log lacks: do not close the database, or
// accept that the next attach starts a new generation).
func (c *Capturer) Flush() error {
	if err := c.Err(); err != nil {
		return err
	}
	// No snapshot may read the database file once Close may checkpoint
	// into it (SQLite's last close does, without asking us).
	c.ckptMu.Lock()
	c.closing = true
	c.ckptMu.Unlock()
	c.curMu.Lock()
	last := c.cur.last
	c.curMu.Unlock()
	return c.log.settle(last)
}

// Close seals the open segment and releases the files; call it after
// sqlexec.DB.Close (closing our
// descriptor of the database file earlier would drop SQLite's POSIX lock
// on it).
func (c *Capturer) Close() error {
	c.syncWG.Wait()
	// Seal what is open: the shipper (Retire) can then send it.
	_, err := c.log.seal()
	if cerr := c.log.close(); err == nil {
		err = cerr
	}
	for _, f := range []*os.File{c.walF, c.dbF} {
		if f != nil {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	return err
}

// Snapshot writes a full image of the database at the last captured
// commit into the staging area, without stopping the writer: it holds
// ckptMu so no checkpoint changes the database file while it reads, and the
// WAL frames it overlays cannot be overwritten (a WAL restart needs a full
// checkpoint first). Returns false if there is nothing new since the last
// snapshot.
func (c *Capturer) Snapshot() (bool, error) {
	c.ckptMu.Lock()
	defer c.ckptMu.Unlock()
	if c.closing {
		return false, nil
	}
	c.curMu.Lock()
	cur := c.cur
	c.curMu.Unlock()
	if cur.last.Txid == 0 || cur.last.Txid <= c.snapTxid.Load() {
		return false, nil
	}
	h, walOK, err := readWALHeader(c.walF)
	if err != nil {
		return false, err
	}
	pos := cur.pos
	if cur.restartOK {
		pos = walPos{} // the database file alone is the image
	}
	im, err := newDBImage(c.dbF, c.walF, h, walOK, pos, int(cur.last.PageSize))
	if err != nil {
		return false, err
	}
	sh := snapHeader{PageSize: cur.last.PageSize, DBSize: cur.last.DBSize, Txid: cur.last.Txid, TimeUs: cur.last.TimeUs, ChainCRC: cur.last.CRC}
	dir := c.log.genDir(cur.gen)
	if err := writeFileAtomic(dir+"/"+localSnapName(snapName{Txid: sh.Txid, TimeUs: sh.TimeUs}), func(f *os.File) error {
		return writeSnapshot(f, sh, im.readPage)
	}); err != nil {
		return false, err
	}
	c.snapTxid.Store(sh.Txid)
	c.snapTimeUs.Store(sh.TimeUs)
	c.bytesSince.Store(0)
	return true, nil
}

// Closing is sqlexec's optional CommitHookCloser: the writer calls it when
// the database closes, after its last commit and before the final
// checkpoint, so Flush cannot be forgotten. An error (a capture that never
// succeeded) is kept in Err; the next attach then starts a new generation.
func (c *Capturer) Closing() {
	if err := c.Flush(); err != nil {
		c.captureErr.Store(&err)
	}
}

var _ sqlexec.CommitHookCloser = (*Capturer)(nil)

// SealForShipping prepares the staging area of a database that is not
// open (a host restart): it recovers it and seals its open segment, so the
// Shipper can send everything (Retire). Call it before the database is
// opened again, never while it is attached.
func (c *Capturer) SealForShipping() error {
	if _, _, err := c.log.recover(); err != nil {
		return err
	}
	if _, err := c.log.seal(); err != nil {
		return err
	}
	if u := c.log.firstPendingUs(c.key); u != 0 {
		c.log.markUnshipped(u)
	}
	return c.log.close()
}

// syncInBackground starts one fsync of the staging file, unless one runs.
func (c *Capturer) syncInBackground() {
	if !c.syncing.CompareAndSwap(false, true) {
		return
	}
	c.syncWG.Add(1)
	go func() {
		defer c.syncWG.Done()
		defer c.syncing.Store(false)
		if err := c.log.syncBehind(); err != nil {
			c.captureErr.Store(&err)
		}
	}()
}
