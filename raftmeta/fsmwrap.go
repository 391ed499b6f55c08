package raftmeta

import (
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// instrumentedFSM sits between Raft and the catalog FSM. It
//   - passes only command entries to the catalog (configuration entries
//     are Raft's business) while recording every index it was handed, so
//     reads can wait for "applied ≥ read index";
//   - wakes read-index waiters after each batch;
//   - measures batch sizes and snapshot durations.
//
// Raft calls Apply/ApplyBatch/Snapshot/Restore from its single FSM
// goroutine; the applied index and the wake-up channel are safe to read from
// any goroutine.
type instrumentedFSM struct {
	cat     *fsm.FSM
	metrics func() *metrics
	log     *slog.Logger

	applied atomic.Uint64

	// beforeApply, when set (tests only), runs before each batch: a test
	// blocks in it to hold a replica behind the commit index it knows.
	beforeApply atomic.Pointer[func()]

	mu     sync.Mutex
	wakeCh chan struct{} // closed and replaced after every apply
}

var (
	_ raft.FSM         = (*instrumentedFSM)(nil)
	_ raft.BatchingFSM = (*instrumentedFSM)(nil)
)

func newInstrumentedFSM(cat *fsm.FSM, m func() *metrics, log *slog.Logger) *instrumentedFSM {
	return &instrumentedFSM{cat: cat, metrics: m, log: log, wakeCh: make(chan struct{})}
}

// logHalt logs a halting FSM (fsm.HaltError: this build is older than the
// cluster's catalog level) through the node's logger, then panics on:
// the replica must stop rather than apply commands its build cannot know.
// Deferred by the calls into the catalog; other panics pass untouched.
func (f *instrumentedFSM) logHalt() {
	r := recover()
	if r == nil {
		return
	}
	if he, ok := r.(*fsm.HaltError); ok && f.log != nil {
		f.log.Error("catalog replica halted: "+he.Error(), "build_level", f.cat.BuildLevel())
	}
	panic(r)
}

func (f *instrumentedFSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

func (f *instrumentedFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	if hook := f.beforeApply.Load(); hook != nil {
		(*hook)()
	}
	out := make([]interface{}, len(logs))
	cmds := make([]*raft.Log, 0, len(logs))
	pos := make([]int, 0, len(logs))
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			cmds = append(cmds, l)
			pos = append(pos, i)
		}
	}
	if len(cmds) > 0 {
		if m := f.metrics(); m != nil {
			m.batchSize.Observe(float64(len(cmds)))
			n := 0
			for _, l := range cmds {
				if k := fsm.BatchEntryCommands(l.Data); k > 0 {
					n += k
				} else {
					n++
				}
			}
			m.batchCommands.Observe(float64(n))
		}
		res := f.applyCatalog(cmds)
		for j, r := range res {
			out[pos[j]] = r
		}
	}
	if n := len(logs); n > 0 {
		f.advance(logs[n-1].Index)
	}
	return out
}

// advance records idx as applied (monotonic) and wakes waiters.
func (f *instrumentedFSM) advance(idx uint64) {
	for {
		cur := f.applied.Load()
		if idx <= cur || f.applied.CompareAndSwap(cur, idx) {
			break
		}
	}
	f.mu.Lock()
	close(f.wakeCh)
	f.wakeCh = make(chan struct{})
	f.mu.Unlock()
}

// appliedIndex is the highest log index the catalog reflects.
func (f *instrumentedFSM) appliedIndex() uint64 {
	a, b := f.applied.Load(), f.cat.AppliedIndex()
	if b > a {
		return b
	}
	return a
}

// wake returns a channel closed at the next apply.
func (f *instrumentedFSM) wake() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wakeCh
}

func (f *instrumentedFSM) Snapshot() (raft.FSMSnapshot, error) {
	start := time.Now()
	s, err := f.cat.Snapshot()
	if m := f.metrics(); m != nil {
		m.snapshotDur.WithLabelValues("capture").Observe(time.Since(start).Seconds())
	}
	if err != nil {
		return nil, err
	}
	return &timedSnapshot{FSMSnapshot: s, metrics: f.metrics}, nil
}

func (f *instrumentedFSM) applyCatalog(cmds []*raft.Log) []interface{} {
	defer f.logHalt()
	return f.cat.ApplyBatch(cmds)
}

func (f *instrumentedFSM) restoreCatalog(rc io.ReadCloser) error {
	defer f.logHalt()
	return f.cat.Restore(rc)
}

func (f *instrumentedFSM) Restore(rc io.ReadCloser) error {
	start := time.Now()
	err := f.restoreCatalog(rc)
	if m := f.metrics(); m != nil {
		m.snapshotDur.WithLabelValues("restore").Observe(time.Since(start).Seconds())
	}
	if err == nil {
		f.advance(f.cat.AppliedIndex())
	}
	return err
}

type timedSnapshot struct {
	raft.FSMSnapshot
	metrics func() *metrics
}

func (s *timedSnapshot) Persist(sink raft.SnapshotSink) error {
	start := time.Now()
	err := s.FSMSnapshot.Persist(sink)
	if m := s.metrics(); m != nil {
		m.snapshotDur.WithLabelValues("persist").Observe(time.Since(start).Seconds())
	}
	return err
}
