package history

import (
	"context"
	"errors"
	"fmt"
	"sort"
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
			for _, p := range g.prevs {
				if err := del(g.keys[p]); err != nil {
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
	if p, ok := a.store.(interface{ pruneDirs(db string) }); ok {
		p.pruneDirs(db) // a directory store keeps empty directories otherwise
	}
	return n, nil
}

// ErrNoDatabaseListing: the store cannot list the databases it holds
// (DatabaseLister not implemented).
var ErrNoDatabaseListing = errors.New("history: this archive store cannot list its databases")

// DatabaseLister is the optional part of a Store that lists the top level
// of the archive: the database keys that have at least one object (or, on
// a directory store, a directory). DirStore and S3Store implement it (S3:
// a delimited listing, one request per 1,000 databases, not a listing of
// every object).
type DatabaseLister interface {
	ListDatabases(ctx context.Context) ([]string, error)
}

// Databases lists the database keys present in the archive, ascending
// (ErrNoDatabaseListing when the store cannot). Only valid keys are
// returned; anything else at the top level is not ours.
func (a *Archive) Databases(ctx context.Context) ([]string, error) {
	l, ok := a.store.(DatabaseLister)
	if !ok {
		return nil, ErrNoDatabaseListing
	}
	names, err := l.ListDatabases(ctx)
	if err != nil {
		return nil, err
	}
	out := names[:0]
	for _, n := range names {
		if validKey(n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}
