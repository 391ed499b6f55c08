package history

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"time"
)

// Archive reads one Store's history: positions, bookmarks, restores.
type Archive struct {
	store Store
}

// NewArchive reads the history kept in store.
func NewArchive(store Store) *Archive { return &Archive{store: store} }

// ErrNoHistory is returned when the archive holds nothing for the point
// asked (before the first generation, after retention removed it, or a
// position the archive does not have yet).
var ErrNoHistory = errors.New("history: no archived state at that point")

// ErrStoreFailed wraps an error of the store itself (a listing or a read
// that failed, a stream it broke) met by a restore or a timestamp's
// resolution: an outage, worth a retry — never damage.
var ErrStoreFailed = errors.New("history: the archive store failed")

// storeFailed wraps a store's error in ErrStoreFailed (ErrNotFound, a
// missing object, is the archive's state, not an outage).
func storeFailed(err error) error {
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrStoreFailed) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStoreFailed, err)
}

// ErrDamaged is returned (as a *DamageError) when the archive lost, or
// holds damaged, an object a restore or a timestamp's resolution needs:
// listed and then gone, missing between two segments it still has, or
// failing its checksum, its txid sequence or its chain. Retrying does not
// help (unlike a store that fails: that error is the store's own). The
// scrubber (scrub.go) finds the same damage ahead of time.
var ErrDamaged = errors.New("history: archive damaged")

// DamageError names what of one generation no longer restores: records
// FirstTxid..LastTxid (for a snapshot, the snapshot's txid), and After,
// the last point before them that a replay reached (zero Position: none).
// It unwraps to the cause (ErrCorrupt, or ErrNotFound for an object the
// listing named that is gone), and errors.Is(err, ErrDamaged) holds.
type DamageError struct {
	Gen                 string
	FirstTxid, LastTxid uint64
	What                string // "records", "snapshot"
	After               Position
	Key                 string // the object that failed its checks, if one was read ("" for a hole)
	Err                 error
}

func (e *DamageError) Error() string {
	if e.What == "snapshot" {
		return fmt.Sprintf("history: archive damaged: generation %s: no snapshot at or before record %d restores: %v", e.Gen, e.LastTxid, e.Err)
	}
	return fmt.Sprintf("history: archive damaged: generation %s: records %d..%d: %v", e.Gen, e.FirstTxid, e.LastTxid, e.Err)
}

// Is makes errors.Is(err, ErrDamaged) hold.
func (e *DamageError) Is(target error) bool { return target == ErrDamaged }

func (e *DamageError) Unwrap() error { return e.Err }

// isDamage reports whether err means the archive's object is lost or
// damaged (not: the store failed).
func isDamage(err error) bool { return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotFound) }

type genIndex struct {
	gen   string
	snaps []snapName // ascending txid
	segs  []segName  // ascending first
	prevs []prevName // markers: how far earlier generations reached
	keys  map[any]string
}

// index lists a database's archive, generations ascending.
func (a *Archive) index(ctx context.Context, db string) ([]*genIndex, error) {
	if !validKey(db) {
		return nil, fmt.Errorf("history: invalid database key %q", db)
	}
	keys, err := a.store.List(ctx, db+"/")
	if err != nil {
		return nil, storeFailed(err)
	}
	byGen := map[string]*genIndex{}
	var gens []*genIndex
	for _, k := range keys {
		parts := strings.Split(strings.TrimPrefix(k, db+"/"), "/")
		if len(parts) != 3 {
			continue
		}
		g := byGen[parts[0]]
		if g == nil {
			if _, ok := parseHex16(parts[0]); !ok {
				continue
			}
			g = &genIndex{gen: parts[0], keys: map[any]string{}}
			byGen[parts[0]] = g
			gens = append(gens, g)
		}
		switch parts[1] {
		case "snap":
			if s, ok := parseSnapName(parts[2]); ok {
				g.snaps = append(g.snaps, s)
				g.keys[s] = k
			}
		case "seg":
			if s, ok := parseSegName(parts[2]); ok {
				g.segs = append(g.segs, s)
				g.keys[s] = k
			}
		case "prev":
			if p, ok := parsePrevName(parts[2]); ok {
				g.prevs = append(g.prevs, p)
				g.keys[p] = k
			}
		}
	}
	sort.Slice(gens, func(i, j int) bool { return gens[i].gen < gens[j].gen })
	for _, g := range gens {
		sort.Slice(g.snaps, func(i, j int) bool { return g.snaps[i].Txid < g.snaps[j].Txid })
		sort.Slice(g.segs, func(i, j int) bool { return g.segs[i].First < g.segs[j].First })
	}
	return gens, nil
}

// restorable reports whether the generation has its base or any snapshot.
func (g *genIndex) restorable() bool { return len(g.snaps) > 0 }

// Latest is the newest archived position of the database.
func (a *Archive) Latest(ctx context.Context, db string) (Position, error) {
	gens, err := a.index(ctx, db)
	if err != nil {
		return Position{}, err
	}
	for i := len(gens) - 1; i >= 0; i-- {
		g := gens[i]
		if !g.restorable() {
			continue
		}
		p := Position{Gen: g.gen, Txid: g.snaps[len(g.snaps)-1].Txid, TimeUs: g.snaps[len(g.snaps)-1].TimeUs}
		// Segments must chain from a snapshot without holes: from any
		// snapshot, so that a hole the store made before a newer
		// snapshot (the scrubber's heal) does not hide what follows it.
		for _, sn := range g.snaps {
			next := sn.Txid + 1
			for _, s := range g.segs {
				if s.First > next {
					break
				}
				if s.Last >= next {
					next = s.Last + 1
					if s.Last > p.Txid {
						p.Txid, p.TimeUs = s.Last, s.LastTimeUs
					}
				}
			}
		}
		return p, nil
	}
	return Position{}, ErrNoHistory
}

// Resolve returns the position of the last commit at or before t: the
// bookmark of a timestamp.
func (a *Archive) Resolve(ctx context.Context, db string, t time.Time) (Position, error) {
	tu := t.UnixMicro()
	gens, err := a.index(ctx, db)
	if err != nil {
		return Position{}, err
	}
	for i := len(gens) - 1; i >= 0; i-- {
		g := gens[i]
		if !g.restorable() || g.snaps[0].TimeUs > tu {
			continue
		}
		best := Position{Gen: g.gen, Txid: g.snaps[0].Txid, TimeUs: g.snaps[0].TimeUs}
		for _, s := range g.snaps {
			if s.TimeUs <= tu {
				best = Position{Gen: g.gen, Txid: s.Txid, TimeUs: s.TimeUs}
			}
		}
		for _, s := range g.segs {
			if s.Last <= best.Txid {
				continue
			}
			if s.LastTimeUs <= tu {
				best = Position{Gen: g.gen, Txid: s.Last, TimeUs: s.LastTimeUs}
				continue
			}
			// The moment falls inside this segment: find the record.
			hole := s.First > best.Txid+1 // records before s the store lost
			before := best
			err := a.readSegment(ctx, g.keys[s], func(h recordHeader, _ []page) error {
				if h.TimeUs <= tu && h.Txid > best.Txid {
					best = Position{Gen: g.gen, Txid: h.Txid, TimeUs: h.TimeUs}
				}
				return nil
			})
			if isDamage(err) {
				de := &DamageError{Gen: g.gen, FirstTxid: max(s.First, best.Txid+1), LastTxid: s.Last, What: "records", After: best, Err: err}
				if errors.Is(err, ErrCorrupt) {
					de.Key = g.keys[s]
				}
				return Position{}, de
			}
			if err != nil {
				return Position{}, err
			}
			if hole && best == before {
				// The last commit at or before t is in the hole, or is
				// the point before it: which one, the lost records
				// alone could tell.
				return Position{}, &DamageError{Gen: g.gen, FirstTxid: before.Txid + 1, LastTxid: s.First - 1, What: "records", After: before,
					Err: fmt.Errorf("%w: records %d..%d missing", ErrNotFound, before.Txid+1, s.First-1)}
			}
			break
		}
		return best, nil
	}
	return Position{}, ErrNoHistory
}

// Next returns the position of the commit right after p in p's generation
// (record p.Txid+1), as the archive holds it: how a caller that knew the
// database's position just before a transaction (its writer was alone)
// finds that transaction's bookmark later. ErrNotFound when the archive
// does not hold it (not shipped yet, or p's generation ended at p).
func (a *Archive) Next(ctx context.Context, db string, p Position) (Position, error) {
	gens, err := a.index(ctx, db)
	if err != nil {
		return Position{}, err
	}
	want := p.Txid + 1
	for _, g := range gens {
		if g.gen != p.Gen {
			continue
		}
		for _, s := range g.snaps {
			if s.Txid == want {
				return Position{Gen: g.gen, Txid: s.Txid, TimeUs: s.TimeUs}, nil
			}
		}
		for _, s := range g.segs {
			if s.First > want || s.Last < want {
				continue
			}
			var found *Position
			err := a.readSegment(ctx, g.keys[s], func(h recordHeader, _ []page) error {
				if h.Txid == want {
					found = &Position{Gen: g.gen, Txid: h.Txid, TimeUs: h.TimeUs}
				}
				return nil
			})
			if err != nil {
				return Position{}, err
			}
			if found != nil {
				return *found, nil
			}
		}
	}
	return Position{}, fmt.Errorf("%w: commit %d of generation %s", ErrNotFound, want, p.Gen)
}

func (a *Archive) readSegment(ctx context.Context, key string, fn func(recordHeader, []page) error) error {
	r, err := a.store.Get(ctx, key)
	if err != nil {
		return storeFailed(err)
	}
	defer r.Close()
	// A stream the store broke mid-read is the store's error, not
	// damage (as in Scrub).
	cr := &countingReader{r: r}
	_, err = readRecords(cr, false, fn)
	return cr.storeErr(err)
}

// RestoreStats describes a restore.
type RestoreStats struct {
	Snapshot      Position // the snapshot it started from
	Records       int      // records replayed on top of it
	BytesRead     int64
	DatabaseBytes int64
}

// errStop ends a segment scan early.
var errStop = errors.New("stop")

// Restore writes the database as of p into the file dst (created or
// replaced atomically: written as dst+".restore-tmp", fsynced, renamed;
// dst's -wal, if any, is removed first so SQLite cannot apply stale frames).
// It starts from the newest snapshot at or before p and replays the
// records after it, verifying every checksum, the txid sequence and the
// CRC chain; p's time must match the record's (a bookmark names one exact
// commit).
func (a *Archive) Restore(ctx context.Context, db string, p Position, dst string) (RestoreStats, error) {
	var st RestoreStats
	tmp := dst + ".restore-tmp"
	if err := a.build(ctx, db, p, tmp, &st); err != nil {
		os.Remove(tmp)
		return st, err
	}
	if err := os.Remove(dst + "-wal"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return st, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return st, err
	}
	return st, syncDir(path.Dir(dst))
}

func (a *Archive) build(ctx context.Context, db string, p Position, tmp string, st *RestoreStats) error {
	gens, err := a.index(ctx, db)
	if err != nil {
		return err
	}
	var g *genIndex
	for _, x := range gens {
		if x.gen == p.Gen {
			g = x
		}
	}
	if g == nil {
		return fmt.Errorf("%w: generation %s", ErrNoHistory, p.Gen)
	}
	if !g.restorable() {
		// Segments without the snapshot they start from: the base (and
		// any later snapshot) was lost. (Retention never leaves a
		// generation without a snapshot: Sweep keeps the newest at or
		// before its cutoff.)
		return &DamageError{Gen: g.gen, LastTxid: p.Txid, What: "snapshot",
			Err: fmt.Errorf("%w: generation %s has segments but no snapshot", ErrNotFound, g.gen)}
	}
	// The newest snapshot at or before p, else an older one: a snapshot
	// the store lost or damaged (found by the scrubber, or not yet) is
	// skipped when an older one and the records after it still lead to p.
	var cands []snapName
	for _, s := range g.snaps {
		if s.Txid <= p.Txid {
			cands = append(cands, s)
		}
	}
	if len(cands) == 0 {
		return fmt.Errorf("%w: no snapshot at or before txid %d", ErrNoHistory, p.Txid)
	}
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var sh snapHeader
	var firstErr error
	for i := len(cands) - 1; i >= 0; i-- {
		if sh, err = a.readSnapshotInto(ctx, g.keys[cands[i]], cands[i], f); err == nil {
			break
		}
		if firstErr == nil {
			firstErr = err
		}
		if !isDamage(err) {
			return err // the store failing: not a reason to read more
		}
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
	if err != nil {
		de := &DamageError{Gen: g.gen, FirstTxid: cands[0].Txid, LastTxid: p.Txid, What: "snapshot", Err: firstErr}
		if errors.Is(firstErr, ErrCorrupt) {
			de.Key = g.keys[cands[len(cands)-1]]
		}
		return de
	}
	st.Snapshot = Position{Gen: g.gen, Txid: sh.Txid, TimeUs: sh.TimeUs}
	st.BytesRead += snapSize(sh)
	dbSize, timeUs, chain, next := sh.DBSize, sh.TimeUs, sh.ChainCRC, sh.Txid+1
	ps := int64(sh.PageSize)
	var scratch []byte // a patched page (version 3 records)
	for _, s := range g.segs {
		if next > p.Txid {
			break
		}
		if s.Last < next {
			continue
		}
		reached := Position{Gen: g.gen, Txid: next - 1, TimeUs: timeUs}
		if s.First > next {
			return &DamageError{Gen: g.gen, FirstTxid: next, LastTxid: s.First - 1, What: "records", After: reached,
				Err: fmt.Errorf("%w: records %d..%d missing", ErrCorrupt, next, s.First-1)}
		}
		err := a.readSegment(ctx, g.keys[s], func(h recordHeader, pages []page) error {
			if h.Txid < next {
				return nil // before the snapshot
			}
			if h.Txid != next {
				return fmt.Errorf("%w: record %d where %d was expected", ErrCorrupt, h.Txid, next)
			}
			if h.PrevCRC != chain {
				return fmt.Errorf("%w: record %d does not chain", ErrCorrupt, h.Txid)
			}
			if int64(h.PageSize) != ps {
				return fmt.Errorf("%w: page size changed at record %d", ErrCorrupt, h.Txid)
			}
			for _, pg := range pages {
				if err := applyPage(f, ps, pg, &scratch); err != nil {
					return err
				}
			}
			st.Records++
			st.BytesRead += recordSize(h)
			dbSize, timeUs, chain, next = h.DBSize, h.TimeUs, h.CRC, h.Txid+1
			if h.Txid == p.Txid {
				return errStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			if isDamage(err) {
				// Records of s before the damaged one were applied;
				// next is the first that was not.
				de := &DamageError{Gen: g.gen, FirstTxid: next, LastTxid: s.Last, What: "records",
					After: Position{Gen: g.gen, Txid: next - 1, TimeUs: timeUs}, Err: err}
				if errors.Is(err, ErrCorrupt) {
					de.Key = g.keys[s]
				}
				return de
			}
			return err
		}
	}
	if next != p.Txid+1 {
		// The replay stopped before p. If the generation holds a later
		// point (a snapshot, a segment), the records between were there
		// once and are lost: damage. Otherwise p is not archived (yet).
		lost := uint64(0)
		for _, sn := range g.snaps {
			if sn.Txid > next && (lost == 0 || sn.Txid-1 < lost) {
				lost = sn.Txid - 1
			}
		}
		for _, sg := range g.segs {
			if sg.First > next && (lost == 0 || sg.First-1 < lost) {
				lost = sg.First - 1
			}
		}
		if lost >= p.Txid {
			return &DamageError{Gen: g.gen, FirstTxid: next, LastTxid: lost, What: "records",
				After: Position{Gen: g.gen, Txid: next - 1, TimeUs: timeUs},
				Err:   fmt.Errorf("%w: records %d..%d missing", ErrNotFound, next, lost)}
		}
		return fmt.Errorf("%w: archive ends at txid %d, before %d", ErrNoHistory, next-1, p.Txid)
	}
	if p.TimeUs != 0 && timeUs != p.TimeUs {
		return fmt.Errorf("%w: txid %d was committed at another time", ErrBadBookmark, p.Txid)
	}
	if err := f.Truncate(int64(dbSize) * ps); err != nil {
		return err
	}
	st.DatabaseBytes = int64(dbSize) * ps
	return f.Sync()
}

// readSnapshotInto reads and checks the snapshot named s into f (from
// offset 0).
func (a *Archive) readSnapshotInto(ctx context.Context, key string, s snapName, f *os.File) (snapHeader, error) {
	r, err := a.store.Get(ctx, key)
	if err != nil {
		return snapHeader{}, storeFailed(err)
	}
	cr := &countingReader{r: r}
	sh, err := readSnapshot(cr, f)
	r.Close()
	if err != nil {
		return sh, cr.storeErr(err)
	}
	if sh.Txid != s.Txid || sh.TimeUs != s.TimeUs {
		return sh, fmt.Errorf("%w: snapshot header does not match its name", ErrCorrupt)
	}
	return sh, nil
}

// VerifyStats describes an archive check.
type VerifyStats struct {
	Skipped     int // generations with nothing restorable after reported damage (VerifyExcept)
	Generations int
	Snapshots   int
	Segments    int
	Records     int
	Last        Position
}

// Verify reads every archived segment of the database and checks each
// record's checksum, that txids run without a gap or a repeat from each
// generation's base, that segments neither overlap nor leave holes, that
// every record chains to its predecessor (and to the snapshots, whose
// headers are read), and that commit times strictly increase across
// generations. It is the "nothing lost, doubled or corrupt" check.
func (a *Archive) Verify(ctx context.Context, db string) (VerifyStats, error) {
	return a.VerifyExcept(ctx, db, nil, nil)
}

// VerifyExcept is Verify around known damage: the lost ranges and damaged
// objects a scrub reported (ScrubReport.Lost and .Damaged, what the host's
// archive_damaged alarm names). A generation with a lost range is
// verified from the end of its last one on (its Until: the snapshot the
// host healed from, or a later snapshot that was intact), every other
// generation entirely; a damaged snapshot is not read. A generation whose
// last lost range has no Until has nothing after it that restores and is
// skipped (Stats.Skipped). Any break outside what was reported is
// ErrCorrupt, as in Verify: the report accounts for the damage, it does
// not waive the rest.
func (a *Archive) VerifyExcept(ctx context.Context, db string, lost []LostRange, damaged []string) (VerifyStats, error) {
	var st VerifyStats
	gens, err := a.index(ctx, db)
	if err != nil {
		return st, err
	}
	var lastUs int64
	for _, g := range gens {
		st.Generations++
		var from *LostRange // the generation's last lost range
		for i, l := range lost {
			if l.Gen == g.gen && (from == nil || l.LastTxid > from.LastTxid) {
				from = &lost[i]
			}
		}
		if from != nil && from.Until.Gen != g.gen {
			st.Skipped++
			if len(g.snaps) > 0 {
				lastUs = max(lastUs, g.snaps[0].TimeUs)
			}
			continue
		}
		if len(g.snaps) == 0 {
			return st, fmt.Errorf("%w: generation %s has no snapshot", ErrCorrupt, g.gen)
		}
		chainAt := map[uint64]uint32{}
		for _, s := range g.snaps {
			if slices.Contains(damaged, g.keys[s]) || from != nil && s.Txid < from.Until.Txid {
				continue
			}
			r, err := a.store.Get(ctx, g.keys[s])
			if err != nil {
				return st, err
			}
			sh, err := readSnapshotHeaderOnly(r)
			r.Close()
			if err != nil {
				return st, err
			}
			chainAt[sh.Txid] = sh.ChainCRC
			st.Snapshots++
		}
		if g.snaps[0].TimeUs <= lastUs {
			return st, fmt.Errorf("%w: generation %s starts before the previous one ends", ErrCorrupt, g.gen)
		}
		lastUs = g.snaps[0].TimeUs
		// The oldest snapshot is where the kept log starts (the base, or
		// the snapshot a retention sweep kept), or the end of the last
		// lost range.
		next, chain := g.snaps[0].Txid+1, chainAt[g.snaps[0].Txid]
		if from != nil {
			c, ok := chainAt[from.Until.Txid]
			if !ok {
				return st, fmt.Errorf("%w: generation %s: no snapshot at %d, where the reported damage ends", ErrCorrupt, g.gen, from.Until.Txid)
			}
			next, chain, lastUs = from.Until.Txid+1, c, from.Until.TimeUs
		}
		inGen := 0
		for _, s := range g.segs {
			if s.Last < next {
				continue
			}
			if s.First > next || s.First < next && inGen > 0 {
				return st, fmt.Errorf("%w: generation %s: segment starts at %d, expected %d", ErrCorrupt, g.gen, s.First, next)
			}
			err := a.readSegment(ctx, g.keys[s], func(h recordHeader, _ []page) error {
				if h.Txid < next {
					return nil // before the kept snapshot
				}
				if h.Txid != next || h.PrevCRC != chain || h.TimeUs <= lastUs {
					return fmt.Errorf("%w: generation %s: record %d (expected %d) breaks the chain", ErrCorrupt, g.gen, h.Txid, next)
				}
				if c, ok := chainAt[h.Txid]; ok && c != h.CRC {
					return fmt.Errorf("%w: snapshot %d does not match its record", ErrCorrupt, h.Txid)
				}
				next, chain, lastUs = h.Txid+1, h.CRC, h.TimeUs
				st.Records++
				return nil
			})
			if err != nil {
				return st, err
			}
			if next-1 != s.Last || lastUs != s.LastTimeUs {
				return st, fmt.Errorf("%w: segment %s does not hold what its name says", ErrCorrupt, g.keys[s])
			}
			st.Segments++
			inGen++
		}
		st.Last = Position{Gen: g.gen, Txid: next - 1, TimeUs: lastUs}
	}
	return st, nil
}

func readSnapshotHeaderOnly(r io.Reader) (snapHeader, error) {
	var hb [snapHeaderSize]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil || string(hb[:4]) != snapMagic {
		return snapHeader{}, fmt.Errorf("%w: snapshot header", ErrCorrupt)
	}
	be := binary.BigEndian
	return snapHeader{PageSize: be.Uint32(hb[8:]), DBSize: be.Uint32(hb[12:]), Txid: be.Uint64(hb[16:]), TimeUs: int64(be.Uint64(hb[24:])), ChainCRC: be.Uint32(hb[32:])}, nil
}
