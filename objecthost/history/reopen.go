package history

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
)

// Reopen is what a Capturer that closed cleanly knows of its staging area:
// the state the next NewCapturer of the same object would otherwise read
// back from disk (localLog.recover: a listing of the area and of its
// newest generation, the tip, every record of open.seg decoded). A host
// reopens a database whose handle it evicted many times a day; only the
// first open after a process start needs that recovery.
//
// Why it is safe. Close hands one out only when the close was clean:
// Flush settled the log (tip written and fsynced, Settled at the last
// captured record), the open segment was sealed (nothing is left in
// open.seg: recovery would find no record newer than the tip), and no
// capture error is pending. At that moment the area on disk holds exactly
// the tip the Reopen carries, which is what recover would return. It lives
// in the process's memory only: a crash (at any step, before or after the
// close) loses it, so the first open after a restart always recovers from
// disk; records a crash left in open.seg, a torn tail, an interrupted
// restore are all found there as before (TestReopenAfterCrashRecovers).
//
// The caller (the object host) must drop it whenever anything else may
// change the area before the next open: a restore (RestoreInPlace,
// RestoreInto, SealForShipping), RemoveStaging, MigrateStaging. The
// shipper may ship and remove sealed files meanwhile: they are not part of
// the state (recover only reads their last record when it is newer than
// the tip, which after a clean close it never is). NewCapturer still
// checks that the generation's tip file exists (one stat) and falls back
// to the recovery otherwise.
type Reopen struct {
	key, name, dir string
	st             tip
	// What the area looked like at the close, checked again by
	// NewCapturer (a read of the tip and two stats) so that a Reopen the
	// caller should have dropped is refused rather than trusted: the tip
	// file's bytes as this log wrote them (any later state writes a
	// different tip: its last record or its generation differ; an
	// identical tip means recovery would return st again), no open.seg,
	// and the area directory's link
	// count (a new generation directory adds one). The tip's inode is no
	// stamp: ext4 hands a freed inode number to the next file created,
	// which is what the tip's rewrite does (found by TestStaleReopenRefused).
	tipBytes  []byte
	areaLinks uint64
}

// Reopen returns the state a later NewCapturer of the same key and staging
// name may start from (CaptureOptions.Reopen) instead of recovering the
// staging area from disk; ok is false unless Close ran and was clean (see
// the type).
func (c *Capturer) Reopen() (r Reopen, ok bool) {
	c.mu.Lock()
	closed := c.closedClean
	c.mu.Unlock()
	if !closed || c.Err() != nil {
		return Reopen{}, false
	}
	st, ok := c.log.cleanTip()
	if !ok {
		return Reopen{}, false
	}
	r = Reopen{key: c.key, name: c.opts.StagingName, dir: c.log.dir, st: st}
	var err error
	// The stamp's tip bytes are the ones this log wrote (writeTip
	// marshals the same tip), not read back from disk: NewCapturer
	// compares them with the file, so a tip that is not this log's is
	// refused there all the same (it used to be read here too, one more
	// file open per cold query's close).
	if r.tipBytes, err = json.Marshal(st); err != nil {
		return Reopen{}, false
	}
	if r.areaLinks, err = areaLinks(c.log.dir, c.log.genDir(st.Gen)); err != nil {
		return Reopen{}, false
	}
	return r, true
}

// areaLinks is areaStamp without the tip: the link count of the area
// directory, failing if genDir holds an open.seg.
func areaLinks(area, genDir string) (uint64, error) {
	if _, err := os.Stat(filepath.Join(genDir, "open.seg")); err == nil {
		return 0, errors.New("history: open segment present")
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	fi, err := os.Stat(area)
	if err != nil {
		return 0, err
	}
	return fileLinks(fi), nil
}

// areaStamp returns the bytes of genDir's tip and the link count of the
// area directory, and fails if genDir holds an open.seg.
func areaStamp(area, genDir string) (tipBytes []byte, links uint64, err error) {
	if tipBytes, err = readSmallFile(filepath.Join(genDir, "tip")); err != nil {
		return nil, 0, err
	}
	if links, err = areaLinks(area, genDir); err != nil {
		return nil, 0, err
	}
	return tipBytes, links, nil
}

// useReopen makes c start from r instead of recovering its staging area
// (NewCapturer). It returns false when r is not for this area or its
// generation is not on disk any more: then the caller recovers.
func (c *Capturer) useReopen(r *Reopen) (bool, error) {
	if r.key != c.key || r.name != c.opts.StagingName || r.dir != c.log.dir || r.st.Gen == "" || !r.st.Settled || r.st.Restore != "" {
		return false, nil
	}
	tipBytes, links, err := areaStamp(c.log.dir, c.log.genDir(r.st.Gen))
	if err != nil || !bytes.Equal(tipBytes, r.tipBytes) || links != r.areaLinks {
		// The area moved on since the close (or cannot be read): recover
		// it from disk, which also reports a real I/O error.
		return false, nil
	}
	c.log.adopt(r.st)
	c.recovered = &recovered{st: r.st, ok: true}
	c.reopened = true
	return true, nil
}

// Reopened reports whether this capturer started from a Reopen (no
// staging recovery ran).
func (c *Capturer) Reopened() bool { return c.reopened }
