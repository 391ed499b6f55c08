package history

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/shoaldb/shoal/internal/durable"
)

// localLog is one object's staging area on the host's disk, the part of
// its database's log not yet in the Store:
//
//	<root>/<db>/<obj>/<gen>/open.seg                 records being appended
//	<root>/<db>/<obj>/<gen>/<first>-<last>-<t>.seg   sealed, waiting to be shipped
//	<root>/<db>/<obj>/<gen>/<txid>-<t>.snap          snapshot waiting to be shipped
//	<root>/<db>/<obj>/<gen>/tip                      last known state (JSON)
//
// <obj> (CaptureOptions.StagingName, the object ID on an object host) keeps
// apart two objects of one database on one host (a relocation away and
// back). Without it the log is <root>/<db>/<gen>/… (the former layout): gen
// directories are 16 hex digits, object IDs 32, so the two never mix.
//
// The capture goroutine appends (one write(2) per batch of transactions,
// no fsync: like the WAL under synchronous=NORMAL, a record survives a
// process crash and may be lost with the OS); the shipper seals and
// removes. mu guards the open file between them.
type localLog struct {
	dir string // <root>/<db>

	mu        sync.Mutex
	gen       string
	open      *os.File
	openFirst recordHeader // first record in open.seg
	openLast  recordHeader
	openBytes int64
	wbFrom    int64 // open.seg's bytes before it were handed to writeback
	// unshippedUs is the commit time of the oldest record not yet in the
	// store (0: none); set by append, cleared by idle.
	unshippedUs int64
	// synced: every record with a txid up to it is durable (fsynced in
	// open.seg or in a sealed segment). 0 after a restart until the next
	// fsync: recovery cannot know what the page cache had written.
	synced atomic.Uint64
	// settled is the txid the tip last declared Settled (-1: none): a seal
	// at that same txid rewrites the tip and must keep saying so, or a WAL
	// restart after it would look like a gap at the next attach.
	settled int64
	// diskTip is the tip this log last wrote or read back, tipOK that the
	// area on disk is exactly that tip and nothing newer (no open.seg
	// with records, no sealed file past it): what recover would return.
	// Any step that may leave more on disk clears tipOK (see cleanTip).
	diskTip tip
	tipOK   bool
	// appended: appendBatch wrote records (ever, through this localLog).
	appended bool
}

// tip is the small state file of a generation, written atomically (temp,
// fsync, rename) at a generation's start, at each seal, at full
// checkpoints and at Flush. Last is the newest record it knows (Txid 0:
// the base snapshot). Settled means that when it was written every
// transaction in the WAL was captured and the WAL may be checkpointed,
// restarted or truncated without losing one (a full checkpoint, or Flush
// before the database closes): at the next attach a WAL that no longer
// holds Last.WAL is then expected, not a gap.
type tip struct {
	Gen     string       `json:"gen"`
	Last    recordHeader `json:"last"`
	Settled bool         `json:"settled"`
	// Restore names the restored file (dbPath+".restore-tmp") that still
	// has to replace the database file: see RestoreInPlace.
	Restore string `json:"restore,omitempty"`
}

func openLocalLog(root, db, obj string) (*localLog, error) {
	l, err := localLogAt(root, db, obj)
	if err != nil {
		return nil, err
	}
	return l, l.mkdir()
}

// localLogAt is openLocalLog without creating the directory (mkdir):
// NewCapturer with a Reopen, whose check stats the area anyway.
func localLogAt(root, db, obj string) (*localLog, error) {
	dir := filepath.Join(root, db)
	if obj != "" {
		if !validKey(obj) {
			return nil, fmt.Errorf("history: invalid staging name %q", obj)
		}
		dir = filepath.Join(dir, obj)
	}
	return &localLog{dir: dir, settled: -1}, nil
}

func (l *localLog) mkdir() error {
	if err := os.MkdirAll(l.dir, 0o755); err != nil {
		return fmt.Errorf("history: staging dir: %w", err)
	}
	return nil
}

func (l *localLog) genDir(gen string) string { return filepath.Join(l.dir, gen) }

// generations returns the generation directories, oldest first.
func (l *localLog) generations() ([]string, error) {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, err
	}
	var gens []string
	for _, e := range ents {
		if _, ok := parseHex16(e.Name()); ok && e.IsDir() {
			gens = append(gens, e.Name())
		}
	}
	sort.Strings(gens)
	return gens, nil
}

// recover reads the newest generation's state after a (re)start: the
// newest of its tip and the last valid record of its segment files. A torn
// tail of open.seg is cut off. Older generations' open files are sealed so
// the shipper sends them. It returns ok=false when there is no generation.
func (l *localLog) recover() (st tip, ok bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open != nil {
		l.open.Close()
		l.open, l.openBytes = nil, 0
	}
	l.tipOK = false
	gens, err := l.generations()
	if err != nil || len(gens) == 0 {
		return tip{}, false, err
	}
	for _, g := range gens[:len(gens)-1] {
		if _, _, err := l.recoverGen(g, true); err != nil {
			return tip{}, false, err
		}
	}
	g := gens[len(gens)-1]
	st, found, err := l.recoverGen(g, false)
	if err != nil || !found {
		return tip{}, false, err
	}
	l.gen = g
	l.settled = -1
	if st.Settled {
		l.settled = int64(st.Last.Txid)
		// Settled only survives recoverGen when the tip file is the newest
		// state; with open.seg still there it is not all there is.
		l.diskTip, l.tipOK = st, l.open == nil
	}
	return st, true, nil
}

func (l *localLog) recoverGen(g string, seal bool) (tip, bool, error) {
	dir := l.genDir(g)
	st := tip{Gen: g}
	found := false
	if b, err := os.ReadFile(filepath.Join(dir, "tip")); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return tip{}, false, fmt.Errorf("%w: tip of %s: %v", ErrCorrupt, dir, err)
		}
		found = true
	} else if !errors.Is(err, fs.ErrNotExist) {
		return tip{}, false, err
	}
	newer := func(h recordHeader) {
		if !found || h.Txid > st.Last.Txid {
			st.Last, st.Settled, found = h, false, true
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return tip{}, false, err
	}
	for _, e := range ents {
		name := e.Name()
		if sn, ok := parseSegName(name); ok {
			// Sealed files are complete (fsynced before the rename): the
			// name says which record is last; read its header only if it
			// would be the newest.
			if !found || sn.Last > st.Last.Txid {
				last, _, _, err := lastRecord(filepath.Join(dir, name), false)
				if err != nil {
					return tip{}, false, err
				}
				newer(last)
			}
		}
	}
	op := filepath.Join(dir, "open.seg")
	last, first, valid, err := lastRecord(op, true)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return tip{}, false, err
	case valid == 0:
		if err := os.Remove(op); err != nil {
			return tip{}, false, err
		}
	default:
		if err := os.Truncate(op, valid); err != nil {
			return tip{}, false, err
		}
		newer(last)
		f, err := os.OpenFile(op, os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return tip{}, false, err
		}
		if seal {
			if err := sealFile(f, dir, first, last); err != nil {
				return tip{}, false, err
			}
		} else {
			l.open, l.openFirst, l.openLast, l.openBytes, l.wbFrom = f, first, last, valid, valid
		}
	}
	return st, found, nil
}

// lastRecord returns the first and last valid records of a segment file
// and the length of its valid prefix.
func lastRecord(path string, tolerateTail bool) (last, first recordHeader, valid int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return last, first, 0, err
	}
	defer f.Close()
	n := 0
	valid, err = readRecords(f, tolerateTail, func(h recordHeader, _ []page) error {
		if n == 0 {
			first = h
		}
		last = h
		n++
		return nil
	})
	return last, first, valid, err
}

// startGeneration makes gen the current generation: seals the previous
// one's open file, writes the prev marker (below), the base snapshot
// through write (into a temp file, fsynced, renamed) and the tip. The tip
// is the checkpoint: until it is written the previous generation is still
// current.
//
// The prev marker names how far the generation it supersedes reached:
// prev, or (prev.Gen == "") this area's current generation as its tip and
// sealed files say. A crash before the tip leaves a marker that claims
// less than that generation may go on to hold: a marker is a lower bound,
// which is all the scrubber reads it as (keys.go).
func (l *localLog) startGeneration(gen string, base snapHeader, write func(f *os.File) error, st tip, prev Position) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.sealLocked(); err != nil {
		return err
	}
	l.tipOK = false
	if prev.Gen == "" && l.gen != "" && l.gen != gen {
		old, found, err := l.recoverGen(l.gen, false)
		if err != nil {
			return err
		}
		if found {
			prev = Position{Gen: l.gen, Txid: old.Last.Txid, TimeUs: old.Last.TimeUs}
		}
	}
	dir := l.genDir(gen)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if prev.Gen != "" && prev.Gen < gen {
		m := prevName{Gen: prev.Gen, Txid: prev.Txid, TimeUs: prev.TimeUs}
		// Not empty: some S3 servers refuse an empty PUT (gofakes3 answers
		// MissingContentLength). The name is what is read.
		body := fmt.Sprintf("{\"gen\":%q,\"txid\":%d,\"time_us\":%d}\n", m.Gen, m.Txid, m.TimeUs)
		if err := writeFileAtomic(filepath.Join(dir, m.file()), func(f *os.File) error {
			_, err := f.WriteString(body)
			return err
		}); err != nil {
			return err
		}
	}
	if err := writeFileAtomic(filepath.Join(dir, localSnapName(snapName{Txid: base.Txid, TimeUs: base.TimeUs})), write); err != nil {
		return err
	}
	st.Gen = gen
	if err := writeTip(dir, st); err != nil {
		return err
	}
	l.gen = gen
	l.settled = -1
	if st.Settled {
		l.settled = int64(st.Last.Txid)
	}
	l.diskTip, l.tipOK = st, true
	return nil
}

func localSnapName(s snapName) string {
	return hex16(s.Txid) + "-" + hex16(uint64(s.TimeUs)) + ".snap"
}

// writebackChunk: the staging file is handed to writeback (startWriteback)
// once this much was appended since the last time: the fsync before a WAL
// restart then has at most a MiB left to write. Handing over every batch
// (~200 KiB under load) cost more CPU (smaller I/Os); per MiB costs about
// what no writeback at all does (BenchmarkStagingWriteback,
// docs/bench/history.md).
const writebackChunk = 1 << 20

// appendBatch writes encoded records (one or more, first to last, in
// txid order) to open.seg with one write(2) (capture goroutine). became
// reports that the log had nothing unshipped before.
func (l *localLog) appendBatch(rec []byte, first, last recordHeader) (became bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gen == "" {
		return false, errors.New("history: no generation")
	}
	l.tipOK = false // records past the tip from here on
	l.appended = true
	if l.open == nil {
		f, err := os.OpenFile(filepath.Join(l.genDir(l.gen), "open.seg"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
		if err != nil {
			return false, err
		}
		l.open, l.openBytes, l.wbFrom = f, 0, 0
	}
	if _, err := l.open.Write(rec); err != nil {
		// A short write leaves a torn tail that recovery cuts off; cut it
		// now so the next append starts clean.
		_ = l.open.Truncate(l.openBytes)
		return false, err
	}
	if l.openBytes == 0 {
		l.openFirst = first
	}
	if l.unshippedUs == 0 {
		l.unshippedUs = first.TimeUs
		became = true
	}
	l.openLast = last
	l.openBytes += int64(len(rec))
	if l.openBytes-l.wbFrom >= writebackChunk {
		startWriteback(l.open, l.wbFrom, l.openBytes-l.wbFrom)
		l.wbFrom = l.openBytes
	}
	return became, nil
}

// sync fsyncs open.seg: done before a checkpoint may drop the frames its
// records came from.
//
// Called by the capture goroutine, which is also the only appender, so
// what it covers cannot grow meanwhile; mu is not held across the fsync
// (the shipper's seal and status calls go on). A seal closing the file
// meanwhile fsyncs it itself: the error of a Sync on a closed file is then
// moot.
func (l *localLog) sync() error {
	l.mu.Lock()
	f, last := l.open, l.openLast.Txid
	l.mu.Unlock()
	if f == nil {
		return nil
	}
	if err := f.Sync(); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return nil
		}
		return err
	}
	l.raiseSynced(last)
	return nil
}

func (l *localLog) raiseSynced(txid uint64) {
	for {
		cur := l.synced.Load()
		if txid <= cur || l.synced.CompareAndSwap(cur, txid) {
			return
		}
	}
}

// seal turns open.seg into an immutable, named segment (and the tip). It
// returns false when there was nothing to seal.
func (l *localLog) seal() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	had := l.open != nil && l.openBytes > 0
	return had, l.sealLocked()
}

func (l *localLog) sealLocked() error {
	if l.open == nil {
		return nil
	}
	if l.openBytes == 0 {
		err := l.open.Close()
		l.open = nil
		return err
	}
	dir := l.genDir(l.gen)
	l.tipOK = false
	// The tip first: once the segment is shipped and removed, it is what
	// remembers the last record.
	st := tip{Gen: l.gen, Last: l.openLast, Settled: l.settled == int64(l.openLast.Txid)}
	if err := writeTip(dir, st); err != nil {
		return err
	}
	err := sealFile(l.open, dir, l.openFirst, l.openLast)
	if err == nil {
		l.raiseSynced(l.openLast.Txid)
		l.diskTip, l.tipOK = st, true // open.seg renamed: the tip is the newest state
	}
	l.open, l.openBytes = nil, 0
	return err
}

// sealFile fsyncs and closes f (open.seg) and renames it to its segment
// name. Checkpoint: the rename; before it a crash leaves open.seg, which
// recovery keeps appending to (or seals, for an old generation).
func sealFile(f *os.File, dir string, first, last recordHeader) error {
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	name := filepath.Base(segKey("x", "x", segName{First: first.Txid, Last: last.Txid, LastTimeUs: last.TimeUs}))
	if err := os.Rename(filepath.Join(dir, "open.seg"), filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

// writeTip writes the tip atomically.
func writeTip(dir string, st tip) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "tip"), func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
}

// settle writes the tip with Settled set at the last record (see tip).
func (l *localLog) settle(last recordHeader) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settled == int64(last.Txid) && l.gen != "" {
		// Already said, at this very record (a database opened and closed
		// without writes): no tip rewrite, no fsync.
		return nil
	}
	if l.open != nil {
		if err := l.open.Sync(); err != nil {
			return err
		}
		l.raiseSynced(l.openLast.Txid)
	}
	st := tip{Gen: l.gen, Last: last, Settled: true}
	if err := writeTip(l.genDir(l.gen), st); err != nil {
		l.tipOK = false
		return err
	}
	l.settled = int64(last.Txid)
	if l.open == nil {
		l.diskTip, l.tipOK = st, true
	}
	return nil
}

// cleanTip returns the tip when the area on disk holds exactly it and
// nothing newer (no open segment; Settled at its last record): what
// recover would return now. See Reopen.
func (l *localLog) cleanTip() (tip, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.diskTip
	if !l.tipOK || l.open != nil || l.gen == "" || t.Gen != l.gen || !t.Settled || t.Restore != "" || l.settled != int64(t.Last.Txid) {
		return tip{}, false
	}
	return t, true
}

// adopt makes st (a cleanTip of an earlier localLog of this area) the
// state, as recover would have (Reopen).
func (l *localLog) adopt(st tip) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open != nil {
		l.open.Close()
		l.open, l.openBytes = nil, 0
	}
	l.gen = st.Gen
	l.settled = int64(st.Last.Txid)
	l.diskTip, l.tipOK = st, true
}

// writeFileAtomic replaces path durably (internal/durable).
func writeFileAtomic(path string, write func(f *os.File) error) error {
	return durable.WriteFile(path, write)
}

// pendingFile is a local file waiting to be shipped.
type pendingFile struct {
	gen, path, key string
	isSnap         bool
	isPrev         bool // a prev marker (keys.go): shipped first in its generation
	firstTxid      uint64
}

// pending lists the sealed segments and snapshots of every generation in
// shipping order: generation by generation, snapshots before the segments
// that follow them, by txid.
func (l *localLog) pending(db string) ([]pendingFile, error) {
	gens, err := l.generations()
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // the area was removed (RemoveStaging): nothing left
	}
	if err != nil {
		return nil, err
	}
	var out []pendingFile
	for _, g := range gens {
		ents, err := os.ReadDir(l.genDir(g))
		if err != nil {
			return nil, err
		}
		var files []pendingFile
		for _, e := range ents {
			name := e.Name()
			p := filepath.Join(l.genDir(g), name)
			if sn, ok := parseSnapName(name); ok {
				files = append(files, pendingFile{gen: g, path: p, key: snapKey(db, g, sn), isSnap: true, firstTxid: sn.Txid})
			} else if sg, ok := parseSegName(name); ok {
				files = append(files, pendingFile{gen: g, path: p, key: segKey(db, g, sg), firstTxid: sg.First})
			} else if pn, ok := parsePrevName(name); ok {
				files = append(files, pendingFile{gen: g, path: p, key: prevKey(db, g, pn), isPrev: true})
			}
		}
		sort.Slice(files, func(i, j int) bool {
			if files[i].isPrev != files[j].isPrev {
				return files[i].isPrev
			}
			if files[i].firstTxid != files[j].firstTxid {
				return files[i].firstTxid < files[j].firstTxid
			}
			return files[i].isSnap && !files[j].isSnap
		})
		out = append(out, files...)
	}
	return out, nil
}

// shipped removes a shipped file, and the generation directory once an old
// generation holds nothing but its tip.
func (l *localLog) shipped(p pendingFile) error {
	if err := os.Remove(p.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	l.mu.Lock()
	cur := l.gen
	l.mu.Unlock()
	if p.gen == cur {
		return nil
	}
	// Never the newest generation on disk: another capturer of the same
	// database (a closed one still shipping, Shipper.Retire, next to the
	// live one after a restore) may be current there.
	if gens, err := l.generations(); err != nil || len(gens) == 0 || p.gen >= gens[len(gens)-1] {
		return err
	}
	ents, err := os.ReadDir(l.genDir(p.gen))
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if e.Name() != "tip" && !strings.HasPrefix(e.Name(), ".tmp-") {
			return nil
		}
	}
	return os.RemoveAll(l.genDir(p.gen))
}

func (l *localLog) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open == nil {
		return nil
	}
	err := l.open.Close()
	l.open = nil
	return err
}

// everAppended reports whether records were ever appended through l.
func (l *localLog) everAppended() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.appended
}

// oldestUnshipped is the commit time (µs) of the oldest record not in the
// store, 0 if none.
func (l *localLog) oldestUnshipped() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unshippedUs
}

// markUnshipped records that sealed files of an earlier run are waiting.
func (l *localLog) markUnshipped(us int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unshippedUs == 0 || us < l.unshippedUs {
		l.unshippedUs = us
	}
}

// idle is called after every sealed file was shipped: it returns true and
// clears the unshipped mark when open.seg is empty too, else moves the
// mark to open.seg's first record.
func (l *localLog) idle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open != nil && l.openBytes > 0 {
		l.unshippedUs = l.openFirst.TimeUs
		return false
	}
	l.unshippedUs = 0
	return true
}

// openAge is the commit time (µs) of open.seg's first record, 0 if empty.
func (l *localLog) openFirstUs() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open == nil || l.openBytes == 0 {
		return 0
	}
	return l.openFirst.TimeUs
}

// firstPendingUs is a cheap stand-in for the commit time of the oldest
// pending file (its modification time), for the lag after a restart; 0 if
// nothing is pending.
func (l *localLog) firstPendingUs(db string) int64 {
	files, err := l.pending(db)
	if err != nil || len(files) == 0 {
		return 0
	}
	var oldest int64
	for _, f := range files {
		if fi, err := os.Stat(f.path); err == nil {
			if u := fi.ModTime().UnixMicro(); oldest == 0 || u < oldest {
				oldest = u
			}
		}
	}
	return oldest
}

// StagingArea names one staging area under a staging root: the database
// key and the object's staging name ("" for the former per-database
// layout, <root>/<key>/<gen>).
type StagingArea struct {
	Key, Name string
}

// StagingAreas lists the staging areas under root (a host's start: what an
// earlier run may have left unshipped).
func StagingAreas(root string) ([]StagingArea, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []StagingArea
	for _, e := range ents {
		if !e.IsDir() || !validKey(e.Name()) {
			continue
		}
		subs, err := os.ReadDir(filepath.Join(root, e.Name()))
		if err != nil {
			return nil, err
		}
		legacy := false
		for _, s := range subs {
			if !s.IsDir() {
				continue
			}
			if _, ok := parseHex16(s.Name()); ok {
				legacy = true
			} else if validKey(s.Name()) {
				out = append(out, StagingArea{Key: e.Name(), Name: s.Name()})
			}
		}
		if legacy {
			out = append(out, StagingArea{Key: e.Name()})
		}
	}
	return out, nil
}

// MigrateStaging moves the generations of key's staging area in the former
// layout (<root>/<key>/<gen>) into the per-object one
// (<root>/<key>/<name>/<gen>), oldest first, so that the object's capturer
// continues them (its history proves continuity instead of starting a new
// generation). Call it at a host's start, before the database opens, and
// only when name is the host's only object of key: with two, whose
// generations they are cannot be told. Each move is one rename; a crash
// between two leaves the rest for the next start. It returns how many
// generations moved.
func MigrateStaging(root, key, name string) (int, error) {
	if !validKey(key) || !validKey(name) {
		return 0, fmt.Errorf("history: invalid staging area %q/%q", key, name)
	}
	old := &localLog{dir: filepath.Join(root, key)}
	gens, err := old.generations()
	if err != nil || len(gens) == 0 {
		return 0, err
	}
	dst := filepath.Join(root, key, name)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return 0, err
	}
	for i, g := range gens {
		if err := os.Rename(filepath.Join(old.dir, g), filepath.Join(dst, g)); err != nil {
			return i, err
		}
		if err := syncDir(dst); err != nil {
			return i + 1, err
		}
		if err := syncDir(old.dir); err != nil {
			return i + 1, err
		}
	}
	return len(gens), nil
}

// StagingPending reports whether a staging area holds records not yet in
// the store (sealed files, or an open segment with records).
func StagingPending(root string, a StagingArea) (bool, error) {
	l, err := stagingLog(root, a)
	if err != nil {
		return false, err
	}
	files, err := l.pending(a.Key)
	if err != nil || len(files) > 0 {
		return len(files) > 0, err
	}
	gens, err := l.generations()
	if err != nil {
		return false, err
	}
	for _, g := range gens {
		if fi, err := os.Stat(filepath.Join(l.genDir(g), "open.seg")); err == nil && fi.Size() > 0 {
			return true, nil
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}
	return false, nil
}

// RemoveStaging removes a staging area (its object is gone from this host
// and StagingPending said nothing is left to ship), and the database's
// directory once empty. Of the former layout's area only the generation
// directories go: object areas may live beside them.
func RemoveStaging(root string, a StagingArea) error {
	l, err := stagingLog(root, a)
	if err != nil {
		return err
	}
	if a.Name != "" {
		if err := os.RemoveAll(l.dir); err != nil {
			return err
		}
	} else {
		gens, err := l.generations()
		if err != nil {
			return err
		}
		for _, g := range gens {
			if err := os.RemoveAll(l.genDir(g)); err != nil {
				return err
			}
		}
	}
	_ = os.Remove(filepath.Join(root, a.Key)) // fails while another area is there
	return syncDir(root)
}

func stagingLog(root string, a StagingArea) (*localLog, error) {
	if !validKey(a.Key) || a.Name != "" && !validKey(a.Name) {
		return nil, fmt.Errorf("history: invalid staging area %q/%q", a.Key, a.Name)
	}
	dir := filepath.Join(root, a.Key)
	if a.Name != "" {
		dir = filepath.Join(dir, a.Name)
	}
	return &localLog{dir: dir, settled: -1}, nil
}
