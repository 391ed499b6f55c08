package fsm

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"github.com/hashicorp/raft"
)

// Batch entries: one Raft log entry carrying N independent commands
// (raftmeta proposes one for a /v1/apply-batch request once the cluster is
// at LevelBatchEntry). The FSM applies them in order, each exactly as it
// would apply the same command as its own entry — its own envelope checks,
// level gate, request-ID dedupe, savepoint and Result — so the catalog and
// every command's answer are those of N entries, except that every Result
// carries the batch entry's log index. What it saves is the per-entry cost
// on every replica: one entry to encode, store, replicate and decode
// instead of N, one future on the leader.
//
// Encoding: batchMagic, then uvarint(N), then N times uvarint(len) and the
// command's bytes — json.Marshal(Command), exactly what its own entry
// would hold, so the create and stats fast decoders apply unchanged. No
// JSON entry starts with a zero byte, so the magic cannot be confused with
// a command; a build without batch entries (level < 3) would answer the
// entry "malformed command" and apply nothing while the others applied its
// commands — hence the level: such a build never sees one (it halts at the
// set_cluster_level that raises the cluster to 3, before any batch entry).
//
// Request-ID positions. The dedupe memory bounds itself to the commands of
// the last DefaultDedupeMaxEntries positions, and snapshots key its rows by
// position (requests.log_index, the table's primary key). Without batch
// entries a command's position is its log index. A batch entry of N
// commands at index L gives them positions L+off … L+off+N-1, where off
// (batchOffset, meta row batch_offset) is how many positions earlier batch
// entries took beyond one each; then off grows by N-1. So positions stay
// one per command, in log order, and equal to the log index in a log
// without batch entries (byte-identical catalogs and snapshots to a
// previous build's there): the memory bound stays N commands, not N
// entries of up to MaxBatchEntryCommands commands each.

// LevelBatchEntry is the catalog level a batch entry needs: the leader
// proposes one only when its applied cluster level is at least this, and
// the FSM refuses one below it (the whole entry, with no effect).
const LevelBatchEntry int64 = 3

// MaxBatchEntryCommands bounds the commands of one batch entry.
const MaxBatchEntryCommands = 4096

// batchMagic starts every batch entry (a JSON command starts with '{').
var batchMagic = []byte{0, 's', 'b', '1'}

// batchOffsetKey is the meta row holding batchOffset; absent = 0, written
// only once a batch entry was applied.
const batchOffsetKey = "batch_offset"

// BatchResults is the FSM's response for a batch entry: one Result per
// command, in order (raft.ApplyFuture.Response()). An entry refused as a
// whole (level below LevelBatchEntry, malformed framing) answers a single
// Result with Err instead, and none of its commands was applied.
type BatchResults []Result

// IsBatchEntry reports whether data is a batch entry.
func IsBatchEntry(data []byte) bool { return bytes.HasPrefix(data, batchMagic) }

// AppendBatchEntry appends the batch entry carrying cmds (each
// json.Marshal(Command)) to dst.
func AppendBatchEntry(dst []byte, cmds [][]byte) []byte {
	n := len(batchMagic) + binary.MaxVarintLen64
	for _, c := range cmds {
		n += binary.MaxVarintLen64 + len(c)
	}
	if cap(dst)-len(dst) < n {
		dst = append(make([]byte, 0, len(dst)+n), dst...)
	}
	dst = append(dst, batchMagic...)
	dst = binary.AppendUvarint(dst, uint64(len(cmds)))
	for _, c := range cmds {
		dst = binary.AppendUvarint(dst, uint64(len(c)))
		dst = append(dst, c...)
	}
	return dst
}

// BatchEntryCommands is the number of commands of a batch entry (0 when
// data is not one or its count is unreadable): the cheap look metrics take.
func BatchEntryCommands(data []byte) int {
	if !IsBatchEntry(data) {
		return 0
	}
	n, k := binary.Uvarint(data[len(batchMagic):])
	if k <= 0 || n > MaxBatchEntryCommands {
		return 0
	}
	return int(n)
}

// splitBatchEntry returns the commands of a batch entry, aliasing data.
func splitBatchEntry(data []byte) ([][]byte, error) {
	p := data[len(batchMagic):]
	n, k := binary.Uvarint(p)
	if k <= 0 || n == 0 || n > MaxBatchEntryCommands {
		return nil, fmt.Errorf("%w: batch entry: bad command count", ErrInvalid)
	}
	p = p[k:]
	out := make([][]byte, 0, n)
	for i := uint64(0); i < n; i++ {
		l, k := binary.Uvarint(p)
		if k <= 0 || l > uint64(len(p)-k) {
			return nil, fmt.Errorf("%w: batch entry: command %d truncated", ErrInvalid, i)
		}
		out = append(out, p[k:k+int(l)])
		p = p[k+int(l):]
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: batch entry: %d bytes after the last command", ErrInvalid, len(p))
	}
	return out, nil
}

// applyBatchEntry applies the commands of the batch entry l inside the open
// transaction, each as applyOne applies an entry of its own. It returns
// BatchResults, or a single Result with Err for an entry refused whole
// (nothing applied, nothing remembered, the offset unchanged: the entry
// takes one position, as any refused entry). An error is fatal.
func (f *FSM) applyBatchEntry(ctx context.Context, l *raft.Log) (any, error) {
	f.batchEntries.Add(1)
	if lvl := f.level.Load(); lvl < LevelBatchEntry {
		return Result{Index: l.Index, Err: ToError(fmt.Errorf(
			"%w: a batch entry needs catalog level %d, the cluster is at level %d", ErrClusterLevelTooLow, LevelBatchEntry, lvl))}, nil
	}
	cmds, err := splitBatchEntry(l.Data)
	if err != nil {
		return Result{Index: l.Index, Err: ToError(err)}, nil
	}
	out := make(BatchResults, len(cmds))
	base := l.Index + f.batchOffset
	for j, c := range cmds {
		r, err := f.applyOne(ctx, c, l.Index, base+uint64(j))
		if err != nil {
			return nil, err
		}
		out[j] = r
	}
	f.batchOffset += uint64(len(cmds) - 1)
	return out, nil
}

// BatchEntries is how many batch entries this FSM was handed since it was
// created, applied or refused whole (not persisted; metrics and tests: a
// cluster below LevelBatchEntry must show none).
func (f *FSM) BatchEntries() uint64 { return f.batchEntries.Load() }
