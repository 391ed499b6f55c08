package history

import (
	"context"
	"fmt"
	"time"
)

// SweepStats counts what a sweep deleted.
type SweepStats struct {
	Deleted int
	Kept    int
}

// Sweep deletes the database's archived objects that no restore to a
// point at or after cutoff can need (retention: cutoff = now - 30 days paid
// / 7 free). It keeps the newest snapshot at or before cutoff (the base
// from which the oldest restorable point is rebuilt) and everything after
// it: older generations entirely, older snapshots and the segments ending
// at or before that snapshot's txid are deleted. Without a snapshot at or
// before cutoff nothing is deleted (the oldest point still needs the base).
//
// Deletion order is oldest first, so a crash mid-sweep leaves a suffix of
// the log that is still restorable; the next sweep finishes the job.
func (a *Archive) Sweep(ctx context.Context, db string, cutoff time.Time) (SweepStats, error) {
	var st SweepStats
	gens, err := a.index(ctx, db)
	if err != nil {
		return st, err
	}
	cu := cutoff.UnixMicro()
	keepGen, keepSnap := -1, snapName{}
	for i, g := range gens {
		for _, s := range g.snaps {
			if s.TimeUs <= cu {
				keepGen, keepSnap = i, s
			}
		}
	}
	if keepGen < 0 {
		for _, g := range gens {
			st.Kept += len(g.snaps) + len(g.segs)
		}
		return st, nil
	}
	del := func(k string) error {
		if err := a.store.Delete(ctx, k); err != nil {
			return err
		}
		st.Deleted++
		return nil
	}
	for i, g := range gens {
		switch {
		case i < keepGen:
			// Entirely before the kept snapshot: out of retention.
			for _, s := range g.segs {
				if err := del(g.keys[s]); err != nil {
					return st, err
				}
			}
			for _, s := range g.snaps {
				if err := del(g.keys[s]); err != nil {
					return st, err
				}
			}
		case i == keepGen:
			for _, s := range g.segs {
				if s.Last <= keepSnap.Txid {
					if err := del(g.keys[s]); err != nil {
						return st, err
					}
				} else {
					st.Kept++
				}
			}
			for _, s := range g.snaps {
				if s.Txid < keepSnap.Txid {
					if err := del(g.keys[s]); err != nil {
						return st, err
					}
				} else {
					st.Kept++
				}
			}
		default:
			st.Kept += len(g.snaps) + len(g.segs)
		}
	}
	return st, nil
}

// DeleteAll deletes every archived object of database db (snapshots and
// segments of every generation): its archive once the database was
// deleted and its time-travel retention passed. The caller decides that
// from the catalog; nothing here checks. Oldest first, like Sweep; a crash
// midway leaves a suffix that the next call deletes. It returns how many
// objects it deleted.
func (a *Archive) DeleteAll(ctx context.Context, db string) (int, error) {
	if !validKey(db) {
		return 0, fmt.Errorf("history: invalid database key %q", db)
	}
	keys, err := a.store.List(ctx, db+"/")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range keys {
		if err := a.store.Delete(ctx, k); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
