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
	// StagingName names this capturer's own staging area,
	// <StagingDir>/<key>/<StagingName> (the object host passes the object
	// ID). Several objects of one database (key) can be on one host at
	// once: a relocation away and back (A→B→A) puts the new object next to
	// the superseded one, which may still hold unshipped files and must
	// never be recovered into, sealed under, or removed with the new one.
	// Empty: <StagingDir>/<key> (the layout before per-object staging;
	// what a host migrates at start, see MigrateStaging).
	StagingName string
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
	// archived. It is called only once the capturer is armed
	// (ArmArchived), after Attach: the commit that closes Attach's own
	// transaction comes before the shipper knows the capturer, and waiting
	// there failed every database of an archived host after a restart.
	WaitArchived func(c *Capturer) error
	// OnAppend is called (capture goroutine, must not block) when records
	// were appended to a log that had nothing unshipped: the Shipper uses it
	// to learn that a database has work (Shipper.Notify).
	OnAppend func(c *Capturer)
	// Reopen, when set, is the Reopen of the previous Capturer of this
	// database and staging name, closed cleanly in this process since the
	// area was last touched by anything else: NewCapturer starts from it
	// instead of recovering the staging area from disk (see Reopen for
	// when a caller must drop it). Ignored if it names another area.
	Reopen *Reopen

	// captureDelay, tests only: the capture goroutine sleeps this long
	// before each batch, so that capture lags behind the commits.
	captureDelay time.Duration
	// appendErr, tests only: when it returns an error, appending to the
	// staging file fails with it.
	appendErr func() error
}

// captureBatchWindow: after a commit wakes the capture goroutine it waits
// this long before capturing, so that one staging write takes every
// commit of the window (unless a waiter needs capture now: a checkpoint,
// Current, Flush, the archived mode). Capture lag is harmless: the frames
// stay in the WAL until captured; it only delays shipping by as much.
const captureBatchWindow = time.Millisecond

// eagerFrames: within this many frames of a checkpoint, every commit wakes
// capture at once (no batching window), so the checkpoint's wait for
// capture is short.
const eagerFrames = 64

// Capturer captures one database's committed transactions into its local
// staging log. It is the sqlexec.CommitHook of that database.
//
// Lifecycle: NewCapturer (before sqlexec.Open: it finishes a restore that a
// crash interrupted), Attach (right after Open; or AttachAtOpen, which has
// Open attach it), Flush (before
// sqlexec.DB.Close), Close (after it: it stops the capture goroutine,
// which the first commit that wrote frames started). Committed is called by sqlexec on the writer goroutine
// only: it publishes the commit (its WAL frame count and time) and
// returns; the capture goroutine turns published commits into records, in
// order, several at a time. Current, Flush, Snapshot and the shipper's
// calls may come from any goroutine.
type Capturer struct {
	key    string
	dbPath string
	opts   CaptureOptions
	log    *localLog

	// The capturer's own read-only descriptors of the WAL and the database
	// file, opened by files() at the first need (attach when the WAL holds
	// frames or a generation starts, else the first capture or snapshot),
	// then only read (ReadAt) by any goroutine, after files() returned.
	// A read-only session at a clean reopen never opens them: attach
	// learns that the WAL is empty from a stat (Close ends lazy opening
	// for good: see files).
	walF, dbF   *os.File
	filesMu     sync.Mutex
	filesOpen   bool
	filesClosed bool // Close ran: files() fails

	// Capture state: written by attach (writer goroutine, before the
	// capture goroutine starts), then by the capture goroutine only.
	pageSize  int
	pos       walPos
	restartOK bool // the WAL at pos was fully checkpointed: a new salt is expected
	last      recordHeader
	hdr       walHeader
	hdrOK     bool // hdr is the WAL header for pos's salts
	buf, rec  []byte
	genReason string // why the last generation was started
	// cache: the last captured version of a few pages, the base of the
	// next records' patches (record version 3; pageCache's invariant).
	cache pageCache

	// Writer goroutine only.
	lastMx       int    // WALFrames at the last commit (0 after a full checkpoint, as SQLite's)
	ckBase       int    // WALFrames at the last checkpoint
	archivedTxid uint64 // WaitArchived confirmed up to here

	armed atomic.Bool // ArmArchived was called: Committed waits for the archive

	// Between the writer, the capture goroutine and waiters (mu).
	mu       sync.Mutex
	cond     sync.Cond     // broadcast after each capture attempt
	queue    []commitEntry // published, not captured yet, in commit order
	pubSeq   uint64        // the last commit published (1, 2, …)
	capSeq   uint64        // every commit up to it is captured
	durSeq   uint64        // … and its record fsynced
	capPos   walPos        // the WAL position after commit capSeq
	wantDur  uint64        // a waiter needs durSeq ≥ wantDur
	started  uint64        // capture attempts started
	failedAt uint64        // the last attempt that failed (0: the last succeeded)
	fullCk   walPos        // a checkpoint backfilled the whole WAL up to here…
	fullCkOK bool          // …so SQLite may restart the WAL after it
	running  bool          // attached and not closed: capture may run
	looping  bool          // the capture goroutine was started
	kick     chan struct{} // a commit was published
	urgent   chan struct{} // someone waits: skip the batching window
	stop     chan struct{}
	stopOnce sync.Once
	loopDone chan struct{}
	// closedClean: Close ran and every step of it succeeded (Reopen).
	closedClean bool
	// batchWindow: how long capture lets commits gather after the first
	// one (captureBatchWindow; tests may change it before Attach).
	batchWindow time.Duration

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
	batches      atomic.Int64 // capture batches written
	checkpoints  atomic.Int64 // full checkpoints
	ckptWaits    atomic.Int64 // time (ns) the writer waited for capture before checkpoints
	walRestarts  atomic.Int64 // new WAL salts followed
	generations  atomic.Int64 // generations started by this capturer
	retired      atomic.Bool  // closed; the shipper drops it once shipped
	attached     atomic.Bool  // attach succeeded (not a SealForShipping capturer)
	hadPending   atomic.Bool  // Shipper.Add found files to ship (or could not list)
	reopened     bool         // started from CaptureOptions.Reopen (set before Attach)
	recovered    *recovered   // staging state read by NewCapturer, used once by attach
}

// commitEntry is one commit the writer published: SQLite's mxFrame after
// it (≤ 0: the commit wrote no frames) and its commit time.
type commitEntry struct {
	seq uint64
	mx  int
	us  int64
}

// CaptureStats are counters of one capturer since NewCapturer.
type CaptureStats struct {
	Records, RecordBytes, FullCheckpoints, WALRestarts, Generations int64
	// Batches is the number of staging writes (each holds one or more
	// records); CheckpointWait is the time the writer spent waiting for
	// capture and fsync before its checkpoints.
	Batches        int64
	CheckpointWait time.Duration
}

// Stats returns the capturer's counters.
func (c *Capturer) Stats() CaptureStats {
	return CaptureStats{c.appendedRecs.Load(), c.appendedB.Load(), c.checkpoints.Load(), c.walRestarts.Load(), c.generations.Load(),
		c.batches.Load(), time.Duration(c.ckptWaits.Load())}
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
	// With a Reopen the area exists unless something removed it, which
	// useReopen's stat of it finds (then it is created below): no
	// MkdirAll on the common cold open.
	l, err := localLogAt(opts.StagingDir, key, opts.StagingName)
	if err != nil {
		return nil, err
	}
	if opts.Reopen == nil || dbPath == "" {
		if err := l.mkdir(); err != nil {
			return nil, err
		}
	}
	c := &Capturer{key: key, dbPath: dbPath, opts: opts, log: l,
		kick: make(chan struct{}, 1), urgent: make(chan struct{}, 1), stop: make(chan struct{}), loopDone: make(chan struct{}),
		batchWindow: captureBatchWindow}
	c.cond.L = &c.mu
	if dbPath == "" {
		return c, nil // staging only (SealForShipping): no file to finish a restore into
	}
	if opts.Reopen != nil {
		// Closed cleanly in this process: no crash left anything to
		// recover, no restore is pending (the host drops a Reopen before
		// restoring), the area is what the previous capturer left.
		used, err := c.useReopen(opts.Reopen)
		if err != nil {
			return nil, err
		}
		if used {
			return c, nil
		}
		if err := l.mkdir(); err != nil {
			return nil, err
		}
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

// AttachAtOpen is Attach done by sqlexec.Open itself: it sets opts so
// that Open attaches c on the opening goroutine, before the database
// serves anything (sqlexec.Options.CommitHook), instead of through a job
// on its writer goroutine after Open returned. The same work in the same
// kind of write transaction; a cold open saves the round trip. If the
// attach fails, Open fails (and the caller closes c).
func (c *Capturer) AttachAtOpen(opts *sqlexec.Options) {
	opts.CommitHook, opts.HookAttach = c, c.attach
}

func (c *Capturer) attach(w sqlexec.HookConn) error {
	var err error
	// The WAL exists once the writer set journal_mode=WAL (persistent WAL).
	// Shorter than its header, it holds no frame (readWALHeader would say
	// so): the common cold open after a clean close, where the last close
	// truncated it. Nothing can write it during attach (its transaction).
	fi, err := os.Stat(c.dbPath + "-wal")
	if err != nil {
		return fmt.Errorf("history: wal: %w", err)
	}
	if fi.Size() >= walHeaderSize {
		if err := c.files(); err != nil {
			return err
		}
	}
	var st tip
	var ok bool
	if r := c.recovered; r != nil {
		st, ok, c.recovered = r.st, r.ok, nil // read by NewCapturer just now
	} else if st, ok, err = c.log.recover(); err != nil {
		return err
	}
	var h walHeader
	walOK := false
	if fi.Size() >= walHeaderSize {
		if h, walOK, err = readWALHeader(c.walF); err != nil {
			return err
		}
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
			// the old salt1 + 1. The writer checkpoints only once every
			// frame is captured and its record fsynced (maybeCheckpoint),
			// and nothing can commit between a crash and this attach, so
			// "old salt1 + 1" means every frame of the old WAL up to our
			// last durable record was captured and the new WAL's frames
			// all come after it.
			continuous = st.Settled || st.Last.WAL.Frames > 0 && h.salt1 == st.Last.WAL.Salt1+1
			c.pos, c.restartOK = walStart(h), false
		}
	}
	if !continuous {
		if ok {
			c.genReason = fmt.Sprintf("cannot prove continuity: tip %+v settled=%v, wal header ok=%v salts %x/%x", st.Last.WAL, st.Settled, walOK, h.salt1, h.salt2)
		}
		if err := c.newGeneration(st.Last.TimeUs, -1); err != nil {
			return err
		}
	} else {
		c.publish(st.Gen)
		if walOK {
			// Catch up: commits that a crash left in the WAL uncaptured
			// (no limit: every checksum is verified; nothing writes now).
			c.hdr, c.hdrOK = h, true
			if err := c.capture(h, -1, nil); err != nil {
				return err
			}
		}
	}
	c.mu.Lock()
	c.capPos = c.pos
	c.running = true // the goroutine starts with the first commit to capture
	c.mu.Unlock()
	c.attached.Store(true)
	return nil
}

// files opens the capturer's descriptors of the database file and the WAL
// unless they are open (any goroutine; see walF). After Close it fails:
// a descriptor opened then would never be closed, and closing it later,
// with the database open again in this process, would drop SQLite's POSIX
// lock on the file (every descriptor of a file shares the process's
// locks), so the capturer's descriptors are closed only by Close, after
// sqlexec.DB.Close.
func (c *Capturer) files() error {
	c.filesMu.Lock()
	defer c.filesMu.Unlock()
	if c.filesOpen {
		return nil
	}
	if c.filesClosed {
		return errCaptureStopped
	}
	// What opened stays until Close, even if the other open fails (see
	// above: closing it now would drop SQLite's lock).
	if c.dbF == nil {
		f, err := openRead(c.dbPath)
		if err != nil {
			return fmt.Errorf("history: open database file: %w", err)
		}
		c.dbF = f
	}
	if c.walF == nil {
		f, err := openRead(c.dbPath + "-wal")
		if err != nil {
			return fmt.Errorf("history: open wal: %w", err)
		}
		c.walF = f
	}
	c.filesOpen = true
	return nil
}

// startLoop starts the capture goroutine unless it runs (c.mu held).
func (c *Capturer) startLoop() {
	if !c.looping && c.running {
		c.looping = true
		go c.run()
	}
}

// newGeneration starts a generation whose base snapshot is the database as
// it is now: the database file overlaid with the WAL's committed frames
// (up to limit, SQLite's mxFrame; -1: verify every checksum, when nothing
// writes). Nothing checkpoints meanwhile: on the writer goroutine (attach)
// nothing else runs, and on the capture goroutine the writer waits for
// capture before it checkpoints.
func (c *Capturer) newGeneration(afterUs int64, limit int) error {
	if err := c.files(); err != nil {
		return err
	}
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
		pos, err = scanWAL(c.walF, h, pos, limit < 0, limit, &c.buf, func(tx *walTx) error {
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
	}, tip{Last: last, Settled: !walOK}, Position{}); err != nil {
		return fmt.Errorf("history: start generation: %w", err)
	}
	c.pageSize, c.pos, c.last, c.restartOK = ps, pos, last, !walOK
	c.hdr, c.hdrOK = h, walOK
	c.cache.reset() // a new base: no record of this generation to patch against
	c.bytesSince.Store(0)
	c.snapTxid.Store(0)
	c.snapTimeUs.Store(startUs)
	c.generations.Add(1)
	c.publish(gen)
	return nil
}

// Committed publishes a commit to the capture goroutine (sqlexec.
// CommitHook, writer goroutine, after COMMIT and before the
// acknowledgement): SQLite's mxFrame after it, which the capture never
// reads past, and its commit time, which becomes the record's. It returns
// at once: capture runs behind the writer, and the frames it has not
// captured stay in the WAL because the writer checkpoints only once
// capture caught up (maybeCheckpoint). It never fails the requests, except
// in `durability = "archived"` mode: a capture error is kept (Err) and
// retried from the same WAL position.
func (c *Capturer) Committed(w sqlexec.HookConn) error {
	mx := w.WALFrames()
	us := c.opts.Now().UnixMicro()
	// A commit that wrote no frames (a read that ran on the writer, a
	// write that changed nothing) leaves SQLite's count as it was: when
	// nothing is queued either, it is captured as it stands, without
	// waking capture (a cold database's first query is such a commit).
	noFrames := mx <= 0 || mx == c.lastMx
	c.mu.Lock()
	c.pubSeq++
	seq := c.pubSeq
	idle := noFrames && len(c.queue) == 0
	if idle {
		if c.durSeq == c.capSeq {
			c.durSeq = seq
		}
		c.capSeq = seq
	} else {
		c.queue = append(c.queue, commitEntry{seq: seq, mx: mx, us: us})
		c.startLoop()
	}
	c.mu.Unlock()
	c.lastMx = mx
	if !idle {
		wake := c.kick
		if mx-c.ckBase >= c.opts.CheckpointFrames-eagerFrames {
			// A checkpoint is near and will wait for capture: keep
			// capture caught up instead of letting commits gather.
			wake = c.urgent
		}
		select {
		case wake <- struct{}{}:
		default: // the capture goroutine has a wake-up pending already
		}
	}
	c.maybeCheckpoint(w, seq, mx)
	if c.opts.WaitArchived != nil && c.armed.Load() {
		unavailable := &sqlexec.Error{Code: v4.CodeUnavailable, Statement: -1,
			Message: "the write is committed on the host but the archive store did not confirm it (durability = archived); it will be archived when the store is back"}
		if err := c.waitFor(seq, false); err != nil {
			return unavailable
		}
		c.curMu.Lock()
		txid := c.cur.last.Txid
		c.curMu.Unlock()
		if txid != c.archivedTxid {
			if err := c.opts.WaitArchived(c); err != nil {
				return unavailable
			}
			c.archivedTxid = txid
		}
	}
	return nil
}

// ArmArchived makes Committed wait for the archive (CaptureOptions.
// WaitArchived) from the next commit on. Call it after Attach, once the
// shipper has the capturer (Shipper.Add): the first commit after it ships
// whatever the recovered log still holds before it is acknowledged.
func (c *Capturer) ArmArchived() { c.armed.Store(true) }

// errCaptureStopped: the capture goroutine is not running (Close, or no
// Attach).
var errCaptureStopped = errors.New("history: capture is not running")

// waitFor waits until commit seq is captured (and with durable, its record
// fsynced). It fails when a capture attempt that started after the call
// failed: the commit stays in the queue and is retried.
func (c *Capturer) waitFor(seq uint64, durable bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	done := func() bool { return c.capSeq >= seq && (!durable || c.durSeq >= seq) }
	if done() {
		return nil
	}
	if !c.running {
		return errCaptureStopped
	}
	if durable && c.wantDur < seq {
		c.wantDur = seq
	}
	c.startLoop()
	from := c.started
	select {
	case c.urgent <- struct{}{}:
	default:
	}
	for !done() {
		if c.failedAt > from {
			if p := c.captureErr.Load(); p != nil {
				return *p
			}
			return errors.New("history: capture failed")
		}
		if !c.running {
			return errCaptureStopped
		}
		c.cond.Wait()
	}
	return nil
}

// run is the capture goroutine: one batch per wake-up (Committed, a
// waiter), until Close. A failed batch is retried at the next wake-up, at
// the latest after a second.
func (c *Capturer) run() {
	defer close(c.loopDone)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	window := time.NewTimer(time.Hour)
	window.Stop()
	defer window.Stop()
	stopped := func() {
		c.mu.Lock()
		c.running = false
		c.cond.Broadcast()
		c.mu.Unlock()
	}
	for {
		urgent := false
		select {
		case <-c.stop:
			stopped()
			return
		case <-c.kick:
		case <-c.urgent:
			urgent = true
		case <-retry.C:
		}
		if c.opts.captureDelay > 0 {
			time.Sleep(c.opts.captureDelay)
		}
		// Let commits gather for a moment unless someone waits: one
		// staging write for all of them, and meanwhile the writer's kicks
		// find no goroutine to wake.
		if c.batchWindow > 0 && !urgent {
			window.Reset(c.batchWindow)
			select {
			case <-c.stop:
				stopped()
				return
			case <-c.urgent:
				window.Stop()
			case <-window.C:
			}
		}
		if err := c.step(); err != nil {
			retry.Reset(time.Second)
		}
	}
}

// step captures every published commit (one staging write for all of
// them) and fsyncs the staging file when a waiter needs it.
func (c *Capturer) step() error {
	c.mu.Lock()
	n := len(c.queue)
	entries := c.queue[:n:n] // Committed only appends after them
	needDur := c.wantDur > c.durSeq
	if c.fullCkOK && c.fullCk == c.pos {
		// The writer's last checkpoint backfilled everything we captured:
		// SQLite may restart the WAL at the next write.
		c.restartOK = true
	}
	c.started++
	attempt := c.started
	c.mu.Unlock()

	var err error
	if n > 0 {
		err = c.captureEntries(entries)
	}
	synced := false
	if err == nil && needDur {
		if c.log.synced.Load() < c.last.Txid {
			err = c.log.sync()
		}
		synced = err == nil
	}
	// Keep the buffers of ordinary batches (one WAL read is at most
	// maxChunkFrames frames; records are written per MiB), drop what a
	// huge page size or transaction grew them to.
	if cap(c.buf) > maxChunkFrames*(walFrameHeaderSize+4096) {
		c.buf = nil
	}
	if cap(c.rec) > 2<<20 {
		c.rec = nil
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.cond.Broadcast()
	if err != nil {
		c.failedAt = attempt
		c.captureErr.Store(&err)
		return err
	}
	if n > 0 {
		c.capSeq = entries[n-1].seq
		rest := copy(c.queue, c.queue[n:])
		c.queue = c.queue[:rest]
	}
	c.capPos = c.pos
	if synced {
		c.durSeq = c.capSeq
	}
	c.failedAt = 0
	c.captureErr.Store(nil)
	return nil
}

// captureEntries captures the transactions of the published commits
// entries (capture goroutine). They all lie in the WAL that is current
// now: the writer restarts a WAL only after a checkpoint it ran once every
// published commit was captured.
func (c *Capturer) captureEntries(entries []commitEntry) error {
	limit := 0
	for _, e := range entries {
		limit = max(limit, e.mx)
	}
	if limit <= 0 {
		return nil // commits that wrote no frames
	}
	if err := c.files(); err != nil {
		return err
	}
	h := c.hdr
	if !c.hdrOK || c.restartOK {
		// A restart is possible only after a full checkpoint (restartOK);
		// otherwise the header read last is still the WAL's.
		var walOK bool
		var err error
		if h, walOK, err = readWALHeader(c.walF); err != nil {
			return err
		}
		if !walOK {
			return errors.New("history: no valid wal header after a commit")
		}
		c.hdr, c.hdrOK = h, true
	}
	if h.salt1 == c.pos.Salt1 && h.salt2 == c.pos.Salt2 && uint32(limit) < c.pos.Frames {
		// SQLite's WAL ends before frames we captured: its recovery
		// dropped them (an OS crash lost WAL writes our log kept). The
		// log is ahead of the database: start over from it.
		c.genReason = "the wal ends before the captured position"
		return c.newGeneration(c.last.TimeUs, limit)
	}
	before := c.pos
	if err := c.capture(h, limit, entries); err != nil {
		return err
	}
	if c.pos == before && h.salt1 == c.pos.Salt1 && h.salt2 == c.pos.Salt2 && uint32(limit) > c.pos.Frames {
		// Nothing found where committed frames should be: the WAL was
		// restarted under us (a checkpoint we did not run). capture()
		// with the new header starts a new generation.
		h2, walOK, err := readWALHeader(c.walF)
		if err != nil {
			return err
		}
		if walOK && (h2.salt1 != h.salt1 || h2.salt2 != h.salt2) {
			c.hdr = h2
			return c.capture(h2, limit, entries)
		}
		return fmt.Errorf("history: wal frames %d..%d not found", c.pos.Frames+1, limit)
	}
	return nil
}

// capture appends a record for each transaction in the WAL after c.pos,
// up to limit (-1: verify every checksum; attach only), with one write(2)
// per MiB of records. entries, in commit order, give each transaction its
// commit time: the first published commit whose frame count reaches its
// commit frame (none: a commit from before the hook was attached, which
// gets the capture time).
func (c *Capturer) capture(h walHeader, limit int, entries []commitEntry) error {
	startTxid := c.last.Txid
	if h.salt1 != c.pos.Salt1 || h.salt2 != c.pos.Salt2 {
		if !c.restartOK {
			// The WAL was restarted under frames we never captured: only a
			// checkpoint we did not run can do that. History cannot prove
			// continuity: start over from the database as it is.
			c.genReason = "wal restarted under uncaptured frames"
			return c.newGeneration(c.last.TimeUs, limit)
		}
		c.pos = walStart(h)
		c.walRestarts.Add(1)
	}
	if c.pageSize != h.pageSize {
		c.cache.reset()
	}
	c.pageSize = h.pageSize
	// What is in the staging file: rolled back to on a failed write.
	okLast, okPos, okRestart := c.last, c.pos, c.restartOK
	var first recordHeader
	c.rec = c.rec[:0]
	dirty := false
	flush := func() error {
		if len(c.rec) == 0 {
			return nil
		}
		var became bool
		var err error
		if c.opts.appendErr != nil {
			err = c.opts.appendErr()
		}
		if err == nil {
			became, err = c.log.appendBatch(c.rec, first, c.last)
		}
		if err != nil {
			c.last, c.pos, c.restartOK = okLast, okPos, okRestart
			c.rec = c.rec[:0]
			// The cache holds versions of records that are not in the log:
			// the retry captures them again, patching against nothing.
			c.cache.reset()
			return fmt.Errorf("history: append: %w", err)
		}
		n := int64(len(c.rec))
		c.bytesSince.Add(n)
		c.appendedB.Add(n)
		c.batches.Add(1)
		dirty = dirty || became
		okLast, okPos, okRestart = c.last, c.pos, c.restartOK
		c.rec = c.rec[:0]
		return nil
	}
	ei := 0
	_, err := scanWAL(c.walF, h, c.pos, false, limit, &c.buf, func(tx *walTx) error {
		for ei < len(entries) && entries[ei].mx < int(tx.end.Frames) {
			ei++
		}
		var t int64
		if ei < len(entries) {
			t = entries[ei].us
		} else {
			t = c.opts.Now().UnixMicro()
		}
		if t <= c.last.TimeUs {
			t = c.last.TimeUs + 1 // strictly increasing: bookmarks sort
		}
		rh := recordHeader{PageSize: uint32(h.pageSize), DBSize: tx.dbSize, PrevCRC: c.last.CRC, Txid: c.last.Txid + 1, TimeUs: t, WAL: tx.end}
		batchStart := len(c.rec) == 0
		c.rec, rh = encodeRecordWith(c.rec, rh, tx.pages, &c.cache)
		c.cache.dropAbove(tx.dbSize) // pages the commit truncated away
		if batchStart {
			first = rh
		}
		c.last, c.pos, c.restartOK = rh, tx.end, false
		c.appendedRecs.Add(1)
		if len(c.rec) >= 1<<20 {
			return flush()
		}
		return nil
	})
	if ferr := flush(); err == nil {
		err = ferr
	}
	if c.last.Txid != startTxid {
		c.publish("")
		if dirty && c.opts.OnAppend != nil {
			c.opts.OnAppend(c)
		}
	}
	return err
}

// maybeCheckpoint checkpoints the WAL once it has grown by
// CheckpointFrames since the last checkpoint (or a test asked). This is
// the only time the writer waits for capture in the default mode:
//
//  1. wait until every commit published so far is captured (capture is
//     usually a few commits behind; a failing capture skips the
//     checkpoint, the frames stay in the WAL);
//  2. ask the capture goroutine to fsync the staging file, and meanwhile
//     run the PASSIVE checkpoint (SQLite fsyncs the WAL, copies the pages
//     into the database file, fsyncs it): the frames are still in the
//     WAL afterwards, only a restart overwrites them;
//  3. wait for that fsync. *Checkpoint: the fsync.* Only now may SQLite
//     restart the fully backfilled WAL, which it does at the next write,
//     on this goroutine, after this returns: from then on those frames
//     exist only in the staging log.
//
// If the fsync fails the WAL may restart anyway: capture then sees a
// restart it was not told about and starts a new generation (an fsync
// error may have dropped the pages: continuity is not claimed).
func (c *Capturer) maybeCheckpoint(w sqlexec.HookConn, seq uint64, mx int) {
	if mx < c.ckBase {
		c.ckBase = 0 // a new WAL (or 0 frames reported after a full checkpoint)
	}
	if mx <= 0 || mx-c.ckBase < c.opts.CheckpointFrames && !c.wantCkpt.Load() {
		return
	}
	if !c.ckptMu.TryLock() {
		return // a snapshot is reading the database file; next commit
	}
	defer c.ckptMu.Unlock()
	t0 := time.Now()
	defer func() { c.ckptWaits.Add(int64(time.Since(t0))) }()
	if err := c.waitFor(seq, false); err != nil {
		return // capture is failing: the frames stay in the WAL
	}

	c.mu.Lock()
	captured := c.capPos
	if c.wantDur < seq {
		c.wantDur = seq
	}
	c.mu.Unlock()
	if captured.Frames != uint32(mx) {
		return // cannot happen: capture reached commit seq, whose WAL ends at mx
	}
	select {
	case c.urgent <- struct{}{}: // the fsync runs while SQLite checkpoints
	default:
	}
	nlog, nckpt, err := w.Checkpoint()
	if err != nil {
		c.captureErr.Store(&err)
		return
	}
	if nlog == nckpt {
		c.lastMx = 0 // HookConn.WALFrames reads 0 now
	}
	c.ckBase = mx
	c.wantCkpt.Store(false)
	if err := c.waitFor(seq, true); err != nil {
		return
	}
	if nlog == nckpt && uint32(nlog) == captured.Frames {
		// The database file holds everything: SQLite may restart the WAL
		// at the next write (salt1 + 1, which is how the next attach
		// recognises that restart; no tip needs writing here). The capture
		// goroutine learns it before it sees a frame of the new WAL.
		c.mu.Lock()
		c.fullCk, c.fullCkOK = captured, true
		c.mu.Unlock()
		c.curMu.Lock()
		if c.cur.pos == captured {
			c.cur.restartOK = true
		}
		c.curMu.Unlock()
		c.checkpoints.Add(1)
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

// Current is the position of the last commit (the database's current
// bookmark): it waits until every commit acknowledged before the call is
// captured (capture runs a few commits behind the writer). If capture is
// failing it returns the last captured commit.
func (c *Capturer) Current() Position {
	c.mu.Lock()
	seq := c.pubSeq
	c.mu.Unlock()
	_ = c.waitFor(seq, false)
	c.curMu.Lock()
	defer c.curMu.Unlock()
	return Position{Gen: c.cur.gen, Txid: c.cur.last.Txid, TimeUs: c.cur.last.TimeUs}
}

// Exact is Current for a point that must include every commit
// acknowledged before the call — a bookmark handed to a client, a
// restore's previous bookmark: while capture is failing it returns the
// error instead of the last captured commit (a restore to that stale point
// would silently drop acknowledged writes made before the bookmark was
// asked for; the robustness suite found exactly that with a host's disk
// full).
func (c *Capturer) Exact() (Position, error) {
	c.mu.Lock()
	seq := c.pubSeq
	c.mu.Unlock()
	if err := c.waitFor(seq, false); err != nil {
		return Position{}, err
	}
	c.curMu.Lock()
	defer c.curMu.Unlock()
	return Position{Gen: c.cur.gen, Txid: c.cur.last.Txid, TimeUs: c.cur.last.TimeUs}, nil
}

// Err is the last capture error, nil once a later capture succeeded.
func (c *Capturer) Err() error {
	if p := c.captureErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Flush captures every commit published so far, makes the staging log
// durable and marks it settled, so that the checkpoint sqlexec.DB.Close
// does is expected at the next attach. Call it after the last write and
// before Close (the writer calls it itself, Closing); it fails if capture
// fails (the WAL then holds commits the log lacks: do not close the
// database, or accept that the next attach starts a new generation).
func (c *Capturer) Flush() error {
	c.mu.Lock()
	seq := c.pubSeq
	c.mu.Unlock()
	if err := c.waitFor(seq, false); err != nil {
		// Not settled: the next attach will not take an empty or restarted
		// WAL for a continuation of a log that lacks those commits.
		return err
	}
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

// Close stops the capture goroutine, seals the open segment and releases
// the files; call it after sqlexec.DB.Close (closing our descriptor of the
// database file earlier would drop SQLite's POSIX lock on it).
func (c *Capturer) Close() error {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		looping := c.looping
		c.running = false // no goroutine starts after this
		c.cond.Broadcast()
		c.mu.Unlock()
		close(c.stop)
		if looping {
			<-c.loopDone
		}
	})
	// Seal what is open: the shipper (Retire) can then send it.
	_, err := c.log.seal()
	if cerr := c.log.close(); err == nil {
		err = cerr
	}
	c.filesMu.Lock()
	c.filesClosed = true // no lazy open after this: see files
	for _, f := range []*os.File{c.walF, c.dbF} {
		if f != nil {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	c.filesMu.Unlock()
	if err == nil && c.attached.Load() {
		// Attached, flushed (or the log is not settled and cleanTip says
		// no), sealed, closed: the next open may skip the recovery.
		c.mu.Lock()
		c.closedClean = true
		c.mu.Unlock()
	}
	return err
}

// Snapshot writes a full image of the database at the last captured
// commit into the staging area, without stopping the writer: it holds
// ckptMu so no checkpoint changes the database file while it reads, and the
// WAL frames it overlays cannot be overwritten (a WAL restart needs a full
// checkpoint first). The database file holds nothing newer than the last
// captured commit: the writer checkpoints only after capture caught up.
// Returns false if there is nothing new since the last snapshot.
func (c *Capturer) Snapshot() (bool, error) {
	_, ok, err := c.snapshot(false)
	return ok, err
}

// ErrClosing: the database is closing; no snapshot can be taken now.
var ErrClosing = errors.New("history: the database is closing")

// Rebase writes a snapshot at the last captured commit even when one of
// that commit exists (or the commit is the generation's base), and
// returns its position: the archive scrubber's healing of a database
// whose archive lost or damaged objects. Once shipped (Shipper.Sync) every
// point from it on restores without anything before it. The snapshot's
// key is that of any snapshot of the same commit, and its bytes are the
// same image (the pages as of that commit): shipping it over a damaged or
// missing one restores it, over an intact one changes nothing.
func (c *Capturer) Rebase() (Position, error) {
	p, _, err := c.snapshot(true)
	return p, err
}

func (c *Capturer) snapshot(force bool) (Position, bool, error) {
	c.ckptMu.Lock()
	defer c.ckptMu.Unlock()
	if c.closing {
		if force {
			return Position{}, false, ErrClosing
		}
		return Position{}, false, nil
	}
	c.curMu.Lock()
	cur := c.cur
	c.curMu.Unlock()
	if !force && (cur.last.Txid == 0 || cur.last.Txid <= c.snapTxid.Load()) {
		return Position{}, false, nil
	}
	if cur.gen == "" {
		return Position{}, false, errCaptureStopped // not attached
	}
	if err := c.files(); err != nil {
		return Position{}, false, err
	}
	h, walOK, err := readWALHeader(c.walF)
	if err != nil {
		return Position{}, false, err
	}
	pos := cur.pos
	if cur.restartOK {
		pos = walPos{} // the database file alone is the image
	}
	im, err := newDBImage(c.dbF, c.walF, h, walOK, pos, int(cur.last.PageSize))
	if err != nil {
		return Position{}, false, err
	}
	sh := snapHeader{PageSize: cur.last.PageSize, DBSize: cur.last.DBSize, Txid: cur.last.Txid, TimeUs: cur.last.TimeUs, ChainCRC: cur.last.CRC}
	dir := c.log.genDir(cur.gen)
	if err := writeFileAtomic(dir+"/"+localSnapName(snapName{Txid: sh.Txid, TimeUs: sh.TimeUs}), func(f *os.File) error {
		return writeSnapshot(f, sh, im.readPage)
	}); err != nil {
		return Position{}, false, err
	}
	c.snapTxid.Store(sh.Txid)
	c.snapTimeUs.Store(sh.TimeUs)
	c.bytesSince.Store(0)
	return Position{Gen: cur.gen, Txid: sh.Txid, TimeUs: sh.TimeUs}, true, nil
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
