package raftmeta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// CodeInvalidBackup is the wire code (HTTP 400) of a restore refused because
// the uploaded file is not a complete, intact catalog backup of this
// build's schema version. The message says what is wrong.
const CodeInvalidBackup = "invalid_backup"

// ErrInvalidBackup is what Admin.Restore returns (wrapped, with the node's
// reason) for a CodeInvalidBackup answer. Nothing was changed.
var ErrInvalidBackup = errors.New("invalid backup")

// checkBackup validates a spooled backup file (size bytes, read through r)
// before raft sees it. A user restore is the one place where a bad snapshot
// is fatal: raft stores the bytes as its newest snapshot, then panics if the
// FSM refuses them (hashicorp/raft restoreUserSnapshot), and that snapshot
// is what the node tries first on every start and what it sends followers.
// So the whole file is checked here — frame, checksum, the SQLite file as a
// catalog of this schema version, integrity_check — and a refusal is an
// *fsm.Error with CodeInvalidBackup. It also checks that the disk can hold
// what the restore writes (the snapshot store's copy and the FSM's), the
// other way the FSM's Restore could fail once raft has stored the bytes
// (refused as ErrUnavailable: the file is fine, the node is not).
func (n *Node) checkBackup(ctx context.Context, r io.Reader, size int64) (fsm.SnapshotInfo, error) {
	if size == 0 {
		return fsm.SnapshotInfo{}, invalidBackup("the file is empty")
	}
	info, err := fsm.CheckSnapshot(ctx, r, n.cfg.Dir)
	if err != nil {
		var ie *fsm.InvalidSnapshotError
		if errors.As(err, &ie) {
			return fsm.SnapshotInfo{}, invalidBackup(ie.Reason)
		}
		return fsm.SnapshotInfo{}, fmt.Errorf("check backup: %w", err)
	}
	if free, ok := diskFree(n.cfg.Dir); ok && free < uint64(2*size) {
		return fsm.SnapshotInfo{}, fmt.Errorf("%w: not enough disk space on %s to restore: the restore writes %d bytes twice (snapshot store, catalog), %d are free",
			ErrUnavailable, n.cfg.ID, size, free)
	}
	return info, nil
}

func invalidBackup(reason string) error {
	return &fsm.Error{Code: CodeInvalidBackup, Message: "invalid backup: " + reason}
}

// lastSnapshotMeta is the snapshot raft itself last took, restored or
// installed, which is not always the newest in the store: a bad snapshot
// left by an earlier version's restore can sort first (see
// setAsideFailedSnapshots).
func (n *Node) lastSnapshotMeta() (*raft.SnapshotMeta, error) {
	metas, err := n.snaps.List()
	if err != nil {
		return nil, err
	}
	if len(metas) == 0 {
		return nil, errors.New("no snapshot available")
	}
	if last, err := strconv.ParseUint(n.raft.Stats()["last_snapshot_index"], 10, 64); err == nil {
		for _, m := range metas {
			if m.Index == last {
				return m, nil
			}
		}
	}
	return metas[0], nil
}

// setAsideFailedSnapshots moves out of the snapshot store every snapshot of
// tried (the store's listing taken just before raft.NewRaft) that raft could
// not restore at start. Raft tries snapshots newest first and keeps the
// first that opens and restores (hashicorp/raft restoreSnapshot), so each
// listed snapshot newer than the one it settled on failed. Such a snapshot —
// in practice the bad upload of a user restore by a version that did not
// check it, after which the leader panicked — would otherwise stay the
// newest: tried and logged as failing on every start, sent to every
// follower that needs an InstallSnapshot (raft sends the newest, which the
// follower then fails to restore, forever), and served as a backup. It goes
// to snapshots-invalid/ (kept for inspection, never read) and the move is
// logged. Snapshots raft takes or installs after NewRaft are not in tried
// and never touched. When raft restored none, NewRaft failed and there is
// nothing to do here: that node must be rebuilt (see docs/operations.md).
func (n *Node) setAsideFailedSnapshots(tried []*raft.SnapshotMeta) {
	last, err := strconv.ParseUint(n.raft.Stats()["last_snapshot_index"], 10, 64)
	if err != nil {
		return
	}
	for _, m := range tried {
		if m.Index <= last {
			continue
		}
		from := filepath.Join(n.cfg.Dir, "snapshots", m.ID)
		to := filepath.Join(n.cfg.Dir, "snapshots-invalid", m.ID)
		err := os.MkdirAll(filepath.Dir(to), 0o755)
		if err == nil {
			err = os.Rename(from, to)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			n.log.Error("cannot set aside a snapshot raft failed to restore", "snapshot", m.ID, "err", err)
			continue
		}
		n.log.Warn("snapshot failed to restore at start; moved to snapshots-invalid/",
			"snapshot", m.ID, "index", m.Index, "restored_index", last)
	}
}
