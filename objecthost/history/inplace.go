package history

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// RestoreInPlace replaces the database file dbPath (closed: its
// sqlexec.DB closed after its Capturer's Flush, and that Capturer closed)
// with its archived state at p, as a new generation of its history. The
// state before the restore stays in the previous generation, so a restore
// is undone by restoring to the bookmark the caller took before it (the
// last archived commit: ship first). It returns the new generation's
// position (the restored state's bookmark).
//
// Steps, each safe to crash after:
//  1. build the state at p into dbPath.restore-tmp and fsync it;
//  2. start the new generation in the staging log, base snapshot = that
//     file, tip marked Restore = the temp file. *Checkpoint*: the tip's
//     rename. Before it the old generation and the old file are current;
//     after it the restore completes on the next NewCapturer;
//  3. empty dbPath-wal, rename the temp file over dbPath, fsync the
//     directory, rewrite the tip without Restore.
func RestoreInPlace(ctx context.Context, a *Archive, key, dbPath string, p Position, opts CaptureOptions) (Position, error) {
	return RestoreInto(ctx, a, key, p, key, dbPath, opts)
}

// RestoreInto is RestoreInPlace from another database's archive: dbPath,
// the file of database dstKey (absent for a new object: a fork, or a
// database relocated off a lost host), becomes srcKey's archived state at
// p, as a new generation of dstKey's history whose base snapshot is that
// state (so dstKey's own archive starts with a full copy, and never
// depends on srcKey's). srcKey == dstKey is RestoreInPlace. Same steps and
// checkpoint; the new generation starts after both p and dstKey's last
// local commit, so commit times keep increasing across generations.
func RestoreInto(ctx context.Context, a *Archive, srcKey string, p Position, dstKey, dbPath string, opts CaptureOptions) (Position, error) {
	if !validKey(srcKey) {
		return Position{}, fmt.Errorf("history: invalid database key %q", srcKey)
	}
	if !validKey(dstKey) {
		return Position{}, fmt.Errorf("history: invalid database key %q", dstKey)
	}
	tmp := dbPath + ".restore-tmp"
	var st RestoreStats
	if err := a.build(ctx, srcKey, p, tmp, &st); err != nil {
		os.Remove(tmp)
		return Position{}, err
	}
	l, err := openLocalLog(opts.StagingDir, dstKey, opts.StagingName)
	if err != nil {
		return Position{}, err
	}
	defer l.close()
	prev, hadGen, err := l.recover()
	if err != nil {
		return Position{}, err
	}
	// The generation superseded: this area's (startGeneration reads it),
	// or for a relocation, which has no area yet, the archived one it
	// continues from (p: what the archive held; records the lost host
	// never shipped are not claimed).
	var superseded Position
	if srcKey == dstKey && !hadGen {
		superseded = p
	}
	f, err := os.Open(tmp)
	if err != nil {
		return Position{}, err
	}
	defer f.Close()
	ps, pages, err := dbFileInfo(f)
	if err != nil {
		return Position{}, err
	}
	if ps == 0 {
		ps = 4096
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	startUs := now().UnixMicro()
	if startUs <= prev.Last.TimeUs {
		startUs = prev.Last.TimeUs + 1
	}
	if p.TimeUs >= startUs {
		startUs = p.TimeUs + 1
	}
	gen := genID(startUs)
	base := snapHeader{PageSize: uint32(ps), DBSize: pages, TimeUs: startUs}
	im := &dbImage{db: f, pageSize: ps}
	last := recordHeader{PageSize: uint32(ps), DBSize: pages, TimeUs: startUs}
	if err := l.startGeneration(gen, base, func(w *os.File) error {
		return writeSnapshot(w, base, im.readPage)
	}, tip{Last: last, Settled: true, Restore: filepath.Base(tmp)}, superseded); err != nil { // the checkpoint
		return Position{}, err
	}
	if err := completeRestore(l, gen, dbPath, last); err != nil {
		return Position{}, err
	}
	return Position{Gen: gen, Txid: 0, TimeUs: startUs}, nil
}

// completeRestore is step 3 of RestoreInPlace; idempotent.
func completeRestore(l *localLog, gen, dbPath string, last recordHeader) error {
	tmp := dbPath + ".restore-tmp"
	if _, err := os.Stat(tmp); err == nil {
		if err := os.Truncate(dbPath+"-wal", 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.Rename(tmp, dbPath); err != nil {
			return err
		}
		if err := syncDir(filepath.Dir(dbPath)); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return writeTip(l.genDir(gen), tip{Gen: gen, Last: last, Settled: true})
}

// finishRestore completes a RestoreInPlace that a crash interrupted after
// its checkpoint (NewCapturer, before the database is opened).
func (c *Capturer) finishRestore() error {
	st, ok, err := c.log.recover()
	if err != nil {
		return err
	}
	if !ok || st.Restore == "" {
		c.recovered = &recovered{st: st, ok: ok} // attach reuses it
		return nil
	}
	return completeRestore(c.log, st.Gen, c.dbPath, st.Last)
}

// recovered is the staging state NewCapturer read, for Attach.
type recovered struct {
	st tip
	ok bool
}
