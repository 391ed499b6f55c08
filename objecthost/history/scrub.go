package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Archive scrubbing: a host reads back what it shipped. An object store
// that loses or damages an object it acknowledged (deleted or overwritten
// behind the host's back) is otherwise found only by the restore that
// needs it. Scrub checks one database's archive against what its host
// knows it shipped; the host (objecthost/scrub.go) paces it over its
// databases, heals what it can (a fresh snapshot at the live database's
// current point: every point from there on restores again) and raises
// the archive_damaged alarm with what no longer restores.

// Shipped is what a host knows it put into the archive of one database's
// current generation: the generation, restorable through Txid. OK false:
// nothing is claimed (the generation's base is not shipped yet, or the
// staging area could not be read).
type Shipped struct {
	Gen  string
	Txid uint64
	OK   bool
}

// ScrubOptions tune one database's check.
type ScrubOptions struct {
	// Sample is how many archived objects are read in full and verified
	// (checksums, txids, the name against the content), chosen at random;
	// negative: all of them. A listing finds every lost object and every
	// hole; damage that keeps the name (an object overwritten with other
	// bytes) is found only by reading it.
	Sample int
	// Rand picks the sample (default: math/rand/v2's global source).
	Rand *rand.Rand
	// Damaged are keys an earlier check found damaged (ScrubReport.
	// Damaged): read again (besides the sample) while listed, so that a
	// pass whose sample misses a damaged object does not find the archive
	// whole again, and one rewritten since (a heal's snapshot of the same
	// commit, an operator's repair) is found whole.
	Damaged []string
	// Cutoff is the retention cutoff (the host's longest retention): like
	// Archive.Sweep, the newest snapshot at or before it is the oldest
	// point that must restore; what lies before it may be swept (or half
	// swept by an interrupted sweep) and is not damage.
	Cutoff time.Time
}

// LostRange is a run of points of one generation that no longer restore:
// txids FirstTxid..LastTxid. After is the last point before them that
// still restores and Until the first one after them (zero Position:
// none; Until is zero until the host healed a current generation). Their
// own commit times are lost with them: they lie after After's time and
// before Until's.
type LostRange struct {
	Gen       string   `json:"gen"`
	FirstTxid uint64   `json:"first_txid"`
	LastTxid  uint64   `json:"last_txid"`
	After     Position `json:"after"`
	Until     Position `json:"until"`
}

// ScrubReport is one database's check.
type ScrubReport struct {
	Objects   int      // objects listed
	Requests  int      // store requests made (one per listing page of 1,000 keys, one per object read)
	Read      int      // objects read and verified
	ReadBytes int64    // their bytes
	Damaged   []string // keys of objects read and found damaged (twice)
	Missing   []string // what is missing, as ranges of records ("gen/seg records a..b", "gen/snap base")
	Lost      []LostRange
	// Current is false when the host's shipped point (Shipped) does not
	// restore: the host must heal (a new snapshot at its current point).
	Current bool
}

// Damage reports whether the archive lost or holds damaged objects.
func (r ScrubReport) Damage() bool {
	return len(r.Lost) > 0 || len(r.Damaged) > 0 || len(r.Missing) > 0 || !r.Current
}

// Scrub checks database db's archive: every generation's snapshots and
// segments (from a listing) for holes, shipped (the host's knowledge of
// its current generation) for a tail that the listing lacks, and a random
// sample of objects (opts.Sample) read in full. It returns the points that
// no longer restore. A store that fails (an outage, a timeout, a short
// read) is an error, never damage: only absence in a listing and a
// checksum that fails on two reads of the whole object count.
func (a *Archive) Scrub(ctx context.Context, db string, shipped Shipped, opts ScrubOptions) (ScrubReport, error) {
	rep := ScrubReport{Current: true}
	gens, err := a.index(ctx, db)
	if err != nil {
		return rep, err
	}
	type obj struct {
		g    *genIndex
		seg  *segName
		snap *snapName
	}
	var all []obj
	for _, g := range gens {
		for i := range g.snaps {
			all = append(all, obj{g: g, snap: &g.snaps[i]})
		}
		for i := range g.segs {
			all = append(all, obj{g: g, seg: &g.segs[i]})
		}
	}
	rep.Objects = len(all)
	rep.Requests = 1 + len(all)/1000
	pick := all
	if opts.Sample >= 0 && opts.Sample < len(all) {
		pick = make([]obj, 0, opts.Sample)
		perm := rand.Perm
		if opts.Rand != nil {
			perm = opts.Rand.Perm
		}
		for _, i := range perm(len(all))[:opts.Sample] {
			pick = append(pick, all[i])
		}
	}
	if len(opts.Damaged) > 0 {
		again := map[string]bool{}
		for _, k := range opts.Damaged {
			again[k] = true
		}
		for _, o := range pick {
			if o.seg != nil {
				delete(again, o.g.keys[*o.seg])
			} else {
				delete(again, o.g.keys[*o.snap])
			}
		}
		for _, o := range all {
			if o.seg != nil && again[o.g.keys[*o.seg]] || o.snap != nil && again[o.g.keys[*o.snap]] {
				pick = append(pick[:len(pick):len(pick)], o)
			}
		}
	}
	bad := map[string]bool{}
	for _, o := range pick {
		var key string
		if o.seg != nil {
			key = o.g.keys[*o.seg]
		} else {
			key = o.g.keys[*o.snap]
		}
		// Damage is confirmed by a second full read: a first failure may
		// be a transfer cut short that the reader could not tell apart.
		var verr error
		for try := 0; try < 2; try++ {
			n, err := a.verifyObject(ctx, key, o.seg, o.snap)
			rep.Requests++
			rep.ReadBytes += n
			if err == nil || !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotFound) {
				verr = err
				break
			}
			verr = err
		}
		rep.Read++
		switch {
		case verr == nil:
		case errors.Is(verr, ErrCorrupt):
			bad[key] = true
			rep.Damaged = append(rep.Damaged, key)
		case errors.Is(verr, ErrNotFound):
			// Listed, then gone: missing now (the range computation
			// below treats it as absent).
			bad[key] = true
			rep.Missing = append(rep.Missing, key)
		default:
			return rep, verr
		}
	}

	// The oldest point that must restore (see ScrubOptions.Cutoff).
	keep := Position{}
	if !opts.Cutoff.IsZero() {
		cu := opts.Cutoff.UnixMicro()
		for _, g := range gens {
			for _, s := range g.snaps {
				if s.TimeUs <= cu {
					keep = Position{Gen: g.gen, Txid: s.Txid, TimeUs: s.TimeUs}
				}
			}
		}
	}
	// How far superseded generations reached, as their successors' prev
	// markers name it (keys.go): their newest segments are named by
	// nothing else once the host's tip moved on.
	reached := map[string]prevName{}
	for _, g := range gens {
		for _, p := range g.prevs {
			if r, ok := reached[p.Gen]; !ok || p.Txid > r.Txid {
				reached[p.Gen] = p
			}
		}
	}
	listed := map[string]bool{}
	for _, g := range gens {
		listed[g.gen] = true
		if g.gen < keep.Gen {
			continue
		}
		var from uint64
		if g.gen == keep.Gen {
			from = keep.Txid
		}
		r, ok := reached[g.gen]
		rep.scrubGen(g, bad, shipped, from, r.Txid, ok)
	}
	for gen, r := range reached {
		if listed[gen] || gen < keep.Gen || shipped.OK && gen == shipped.Gen {
			// Listed (checked above); swept by retention (before the
			// keep point: a sweep's cutoff only moves forward, so what it
			// deleted lies before today's keep point); or the current
			// generation (the staging tip's, checked above).
			continue
		}
		rep.Missing = append(rep.Missing, fmt.Sprintf("%s: every object (a later generation names its records up to %d)", gen, r.Txid))
		rep.Lost = append(rep.Lost, LostRange{Gen: gen, FirstTxid: 0, LastTxid: r.Txid})
	}
	sort.Slice(rep.Lost, func(i, j int) bool {
		if rep.Lost[i].Gen != rep.Lost[j].Gen {
			return rep.Lost[i].Gen < rep.Lost[j].Gen
		}
		return rep.Lost[i].FirstTxid < rep.Lost[j].FirstTxid
	})
	if shipped.OK {
		found := false
		for _, g := range gens {
			found = found || g.gen == shipped.Gen
		}
		if !found {
			// The whole current generation is gone from the listing.
			rep.Missing = append(rep.Missing, fmt.Sprintf("%s: every object (records up to %d)", shipped.Gen, shipped.Txid))
			rep.Lost = append(rep.Lost, LostRange{Gen: shipped.Gen, FirstTxid: 0, LastTxid: shipped.Txid})
			rep.Current = false
		}
	}
	return rep, nil
}

// scrubGen computes what of generation g restores: from every snapshot
// not found damaged, as far as the segments after it run without a hole
// or a damaged segment. Everything else between the generation's oldest
// point that must restore (its base, or the retention's keep point) and
// its newest known one (the newest object, or what the host shipped) is
// lost.
//
// Nothing before txid from counts (retention: ScrubOptions.Cutoff). A
// later generation's prev marker naming g (named: it reached record
// reached) extends its known points like the host's shipped point does
// for the current generation.
func (rep *ScrubReport) scrubGen(g *genIndex, bad map[string]bool, shipped Shipped, from, reached uint64, named bool) {
	type span struct {
		from, to     uint64
		fromP, toP   Position
		fromOK, toOK bool
	}
	var good []span
	for _, s := range g.snaps {
		if bad[g.keys[s]] {
			continue
		}
		next := s.Txid + 1
		end := Position{Gen: g.gen, Txid: s.Txid, TimeUs: s.TimeUs}
		for _, sg := range g.segs {
			if sg.Last < next {
				continue
			}
			if sg.First > next || bad[g.keys[sg]] {
				break
			}
			next = sg.Last + 1
			end = Position{Gen: g.gen, Txid: sg.Last, TimeUs: sg.LastTimeUs}
		}
		good = append(good, span{from: s.Txid, to: next - 1, fromP: Position{Gen: g.gen, Txid: s.Txid, TimeUs: s.TimeUs}, toP: end})
	}
	sort.Slice(good, func(i, j int) bool { return good[i].from < good[j].from })
	var merged []span
	for _, s := range good {
		if n := len(merged); n > 0 && s.from <= merged[n-1].to+1 {
			if s.to > merged[n-1].to {
				merged[n-1].to, merged[n-1].toP = s.to, s.toP
			}
			continue
		}
		merged = append(merged, s)
	}

	// The generation's known points: from its oldest snapshot (damaged or
	// not; without one, the base its first segment needed) to its newest
	// record or snapshot, or what the host shipped.
	// Nothing after the retention's keep point was ever swept (a sweep's
	// cutoff only moves forward; see ScrubOptions.Cutoff), so a
	// generation's points start at its base, or at the keep point.
	lo, hi := from, uint64(0)
	known := len(g.snaps) > 0 || len(g.segs) > 0
	for _, s := range g.snaps {
		hi = max(hi, s.Txid)
	}
	for _, sg := range g.segs {
		hi = max(hi, sg.Last)
	}
	if hi < lo {
		hi = lo
	}
	if named && known && reached > hi {
		rep.Missing = append(rep.Missing, fmt.Sprintf("%s: records after %d (a later generation names its records up to %d)", g.gen, hi, reached))
		hi = reached
	}
	if known && (len(g.snaps) == 0 || g.snaps[0].Txid > lo) {
		rep.Missing = append(rep.Missing, fmt.Sprintf("%s: the snapshot at %d", g.gen, lo))
	}
	if shipped.OK && shipped.Gen == g.gen {
		if shipped.Txid > hi {
			rep.Missing = append(rep.Missing, fmt.Sprintf("%s: records after %d (the host shipped up to %d)", g.gen, hi, shipped.Txid))
		}
		hi = max(hi, shipped.Txid)
		if !known {
			lo, known = 0, true
		}
		in := false
		for _, s := range merged {
			in = in || s.from <= shipped.Txid && shipped.Txid <= s.to
		}
		rep.Current = in
	}
	if !known {
		return
	}
	// Holes between segments after the oldest snapshot (a listing's view;
	// damaged objects are in rep.Damaged already).
	next := lo + 1
	for _, sg := range g.segs {
		if sg.Last < next {
			continue
		}
		if sg.First > next {
			rep.Missing = append(rep.Missing, fmt.Sprintf("%s: records %d..%d", g.gen, next, sg.First-1))
		}
		next = sg.Last + 1
	}
	// Lost: [lo, hi] minus the merged spans.
	at := lo
	var prev *span
	for i := range merged {
		s := &merged[i]
		if s.to < at {
			prev = s
			continue
		}
		if s.from > at {
			r := LostRange{Gen: g.gen, FirstTxid: at, LastTxid: s.from - 1, Until: s.fromP}
			if prev != nil {
				r.After = prev.toP
			}
			rep.Lost = append(rep.Lost, r)
		}
		at = s.to + 1
		prev = s
		if s.to >= hi {
			break
		}
	}
	if at <= hi && (prev == nil || prev.to < hi) {
		r := LostRange{Gen: g.gen, FirstTxid: at, LastTxid: hi}
		if prev != nil {
			r.After = prev.toP
		}
		rep.Lost = append(rep.Lost, r)
	}
}

// verifyObject reads one archived object in full and checks it: a
// segment's records (checksums, consecutive txids chained by CRC, first
// and last as its name says), a snapshot's checksum and header. It
// returns the bytes read. A read the store cut short is the store's
// error, not ErrCorrupt.
func (a *Archive) verifyObject(ctx context.Context, key string, seg *segName, snap *snapName) (int64, error) {
	r, err := a.store.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	cr := &countingReader{r: r}
	if snap != nil {
		sh, err := readSnapshot(cr, io.Discard)
		if err == nil && (sh.Txid != snap.Txid || sh.TimeUs != snap.TimeUs) {
			err = fmt.Errorf("%w: snapshot header does not match its name", ErrCorrupt)
		}
		if err == nil {
			// Nothing may follow the trailer.
			var b [1]byte
			if n, _ := io.ReadFull(cr, b[:]); n > 0 {
				err = fmt.Errorf("%w: bytes after the snapshot trailer", ErrCorrupt)
			}
		}
		return cr.n, cr.storeErr(err)
	}
	var n int
	var last recordHeader
	_, err = readRecords(cr, false, func(h recordHeader, _ []page) error {
		switch {
		case n == 0 && h.Txid != seg.First:
			return fmt.Errorf("%w: segment %s starts at record %d", ErrCorrupt, key, h.Txid)
		case n > 0 && (h.Txid != last.Txid+1 || h.PrevCRC != last.CRC):
			return fmt.Errorf("%w: segment %s: record %d does not follow %d", ErrCorrupt, key, h.Txid, last.Txid)
		}
		n++
		last = h
		return nil
	})
	if err == nil && (n == 0 || last.Txid != seg.Last || last.TimeUs != seg.LastTimeUs) {
		err = fmt.Errorf("%w: segment %s does not hold what its name says", ErrCorrupt, key)
	}
	return cr.n, cr.storeErr(err)
}

// countingReader counts the bytes read and remembers a failing read: a
// verification that failed because the store's stream broke is an
// outage, not damage.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

// storeErr turns a verification error into the store's error when the
// stream itself failed.
func (c *countingReader) storeErr(err error) error {
	if err != nil && c.err != nil {
		return fmt.Errorf("%w: reading the archive: %w", ErrStoreFailed, c.err)
	}
	return err
}

// ShippedOf reads what a staging area says its object shipped of its
// current (newest) generation: the tip's last record, less whatever is
// still local (sealed files waiting, open.seg). It reads the tip before
// listing the directory: a record is removed locally only after its Put
// returned, so anything the tip names that the listing does not show as
// local was in the store before this call ended. A host scrubs after
// reading this, never before.
func ShippedOf(root string, a StagingArea) (Shipped, error) {
	l, err := stagingLog(root, a)
	if err != nil {
		return Shipped{}, err
	}
	gens, err := l.generations()
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(gens) == 0 {
		return Shipped{}, nil
	}
	if err != nil {
		return Shipped{}, err
	}
	g := gens[len(gens)-1]
	dir := l.genDir(g)
	b, err := os.ReadFile(filepath.Join(dir, "tip"))
	if errors.Is(err, fs.ErrNotExist) {
		return Shipped{}, nil // the generation is being started
	}
	if err != nil {
		return Shipped{}, err
	}
	var st tip
	if err := json.Unmarshal(b, &st); err != nil {
		return Shipped{}, fmt.Errorf("%w: tip of %s: %v", ErrCorrupt, dir, err)
	}
	if st.Restore != "" {
		return Shipped{}, nil // a restore in progress: its base is not shipped
	}
	through := st.Last.Txid
	ents, err := os.ReadDir(dir)
	if err != nil {
		return Shipped{}, err
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case name == "open.seg":
			_, first, valid, err := lastRecord(filepath.Join(dir, name), true)
			if errors.Is(err, fs.ErrNotExist) {
				return Shipped{}, nil // sealed meanwhile, under a name not listed: claim nothing
			}
			if err != nil {
				return Shipped{}, err
			}
			if valid == 0 {
				// Empty, or its first record still being written: what
				// it will hold is not known.
				return Shipped{}, nil
			}
			if first.Txid == 0 {
				return Shipped{}, nil
			}
			through = min(through, first.Txid-1)
		default:
			if sn, ok := parseSegName(name); ok {
				if sn.First == 0 {
					return Shipped{}, nil
				}
				through = min(through, sn.First-1)
			} else if sn, ok := parseSnapName(name); ok {
				if sn.Txid == 0 {
					return Shipped{}, nil // the base is not shipped yet
				}
				// A later snapshot waiting says nothing about records.
			}
		}
	}
	return Shipped{Gen: g, Txid: through, OK: true}, nil
}
