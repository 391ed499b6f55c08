package raftmeta

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
)

// Log store kinds for Config.LogStore.
const (
	// LogStoreWAL is hashicorp/raft-wal: append-only segment files, one
	// fsync per appended batch. The default for new data directories: on
	// this machine type a 3-voter cluster with it makes 1.3–1.4x the
	// creates/s of raft-boltdb/v2, and only with it does the catalog reach
	// its throughput targets (docs/benchmarks.md, raftmeta/DESIGN.md).
	LogStoreWAL = "wal"
	// LogStoreBolt is raft-boltdb/v2 (bbolt): two fsyncs per appended batch
	// (pages, then the meta page). Fully supported: pick it with
	// catalog.log_store = "bolt" (or --log-store bolt) for new directories;
	// a directory created with it keeps it.
	LogStoreBolt = "bolt"
)

const (
	boltFile = "raft.db"  // LogStoreBolt's file in Config.Dir
	walDir   = "raft-wal" // LogStoreWAL's directory in Config.Dir
)

// ErrLogStoreMismatch: the data directory holds the other kind of Raft log
// than the one configured. Opening the configured kind would start from an
// empty log and lose the node's state (or bootstrap it again).
var ErrLogStoreMismatch = errors.New("raftmeta: data directory holds another log store")

// logStore is Raft's log and stable store (term, vote) in one.
type logStore interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// chooseLogStore resolves Config.LogStore against what dir holds: an
// existing store always wins over the default (so a restarted node finds
// its state), and an explicit choice that contradicts it is refused.
func chooseLogStore(dir, want string) (string, error) {
	exists := func(name string) (bool, error) {
		_, err := os.Stat(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		// Any other failure is not "absent": guessing wrong would open an
		// empty log over existing state.
		return err == nil, err
	}
	hasBolt, err := exists(boltFile)
	if err != nil {
		return "", fmt.Errorf("inspect log store: %w", err)
	}
	hasWAL, err := exists(walDir)
	if err != nil {
		return "", fmt.Errorf("inspect log store: %w", err)
	}
	switch {
	case hasBolt && hasWAL:
		return "", fmt.Errorf("%w: both %s and %s exist in %s", ErrLogStoreMismatch, boltFile, walDir, dir)
	case hasBolt && want == LogStoreWAL, hasWAL && want == LogStoreBolt:
		return "", fmt.Errorf("%w: configured %q, %s holds the other kind", ErrLogStoreMismatch, want, dir)
	case hasBolt:
		return LogStoreBolt, nil
	case hasWAL:
		return LogStoreWAL, nil
	case want == "":
		return LogStoreWAL, nil
	case want == LogStoreWAL, want == LogStoreBolt:
		return want, nil
	}
	return "", fmt.Errorf("raftmeta: unknown log store %q (want %q or %q)", want, LogStoreWAL, LogStoreBolt)
}

// openLogStore opens the Raft log of kind in dir. Both kinds fsync every
// append before returning (acknowledged = durable on this node).
func openLogStore(dir, kind string, hlog hclog.Logger) (logStore, error) {
	switch kind {
	case LogStoreWAL:
		p := filepath.Join(dir, walDir)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", p, err)
		}
		meta := &metadb.BoltMetaDB{}
		w, err := wal.Open(p, wal.WithLogger(hlog.Named("wal")), wal.WithMetaStore(meta))
		if err != nil {
			meta.Close()
			return nil, err
		}
		return &walStore{WAL: w, meta: meta}, nil
	case LogStoreBolt:
		// NoSync false: every append is fsynced before Raft acknowledges it.
		// NoFreelistSync (as Consul runs it): the free list is rebuilt on open
		// instead of rewritten by every commit, which after log compaction is
		// most of the pages a small append would otherwise write.
		return raftboltdb.New(raftboltdb.Options{
			Path: filepath.Join(dir, boltFile), NoSync: false,
			BoltOptions: &bbolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType},
		})
	}
	return nil, fmt.Errorf("raftmeta: unknown log store %q", kind)
}

// walStore closes the WAL's meta database too: raft-wal v0.4.0's Close
// leaves it open, and its bbolt file lock would make the next open in the
// same process (a node restarted in place, the tests) wait forever.
type walStore struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
}

func (s *walStore) Close() error {
	return errors.Join(s.WAL.Close(), s.meta.Close())
}
