package raftmeta

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// JoinRequest asks the leader to add a node.
type JoinRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	Voter    bool   `json:"voter"`
}

// Join adds a node as a voter or non-voter. It must run on the leader.
// Joining again with the same ID and address is a no-op; a known ID at a new
// address (or a new ID at a known address) replaces the old entry.
func (n *Node) Join(ctx context.Context, r JoinRequest) error {
	if r.ID == "" || r.RaftAddr == "" {
		return &fsm.Error{Code: fsm.CodeInvalid, Message: "join needs id and raft_addr"}
	}
	if n.raft.State() != raft.Leader {
		return n.notLeader()
	}
	n.levelMu.Lock() // see raiseClusterLevel
	defer n.levelMu.Unlock()
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return err
	}
	for _, s := range cf.Configuration().Servers {
		sameID, sameAddr := s.ID == raft.ServerID(r.ID), s.Address == raft.ServerAddress(r.RaftAddr)
		if sameID && sameAddr && (s.Suffrage == raft.Voter) == r.Voter {
			return nil
		}
	}
	// Before any change: a server whose build is older than the cluster's
	// catalog level would halt on its first entry (level.go).
	if err := n.checkJoinLevel(ctx, r); err != nil {
		return err
	}
	for _, s := range cf.Configuration().Servers {
		sameID, sameAddr := s.ID == raft.ServerID(r.ID), s.Address == raft.ServerAddress(r.RaftAddr)
		if sameID || sameAddr {
			if err := n.raft.RemoveServer(s.ID, 0, n.cfg.ApplyTimeout).Error(); err != nil {
				return n.leaderOpErr("remove stale member", err)
			}
		}
	}
	var f raft.IndexFuture
	if r.Voter {
		f = n.raft.AddVoter(raft.ServerID(r.ID), raft.ServerAddress(r.RaftAddr), 0, n.cfg.ApplyTimeout)
	} else {
		f = n.raft.AddNonvoter(raft.ServerID(r.ID), raft.ServerAddress(r.RaftAddr), 0, n.cfg.ApplyTimeout)
	}
	if err := f.Error(); err != nil {
		return n.leaderOpErr("add member", err)
	}
	n.log.Info("member added", "id", r.ID, "raft", r.RaftAddr, "voter", r.Voter)
	return nil
}

// Remove removes a member. It must run on the leader.
func (n *Node) Remove(ctx context.Context, id string) error {
	if id == "" {
		return &fsm.Error{Code: fsm.CodeInvalid, Message: "remove needs an id"}
	}
	if n.raft.State() != raft.Leader {
		return n.notLeader()
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return err
	}
	found := false
	for _, s := range cf.Configuration().Servers {
		found = found || s.ID == raft.ServerID(id)
	}
	if !found {
		return &fsm.Error{Code: fsm.CodeNotFound, Message: fmt.Sprintf("no member with id %q", id)}
	}
	if err := n.raft.RemoveServer(raft.ServerID(id), 0, n.cfg.ApplyTimeout).Error(); err != nil {
		return n.leaderOpErr("remove member", err)
	}
	return nil
}

func (n *Node) leaderOpErr(what string, err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return n.notLeader()
	}
	return fmt.Errorf("%s: %w", what, err)
}

// joinCluster asks the nodes at addrs (HTTP) to add this node, following a
// not_leader answer to the named leader, with bounded retries.
func joinCluster(ctx context.Context, hc *http.Client, scheme string, addrs []string, r JoinRequest) error {
	body, _ := json.Marshal(r)
	var lastErr error
	for attempt := 0; ; attempt++ {
		for i := 0; i < len(addrs); i++ {
			target := addrs[i]
			for hop := 0; hop < 3 && target != ""; hop++ {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, scheme+"://"+target+"/v1/cluster/join", bytes.NewReader(body))
				if err != nil {
					return err
				}
				resp, err := hc.Do(req)
				if err != nil {
					lastErr = fmt.Errorf("%s: %w", target, err)
					break
				}
				err = decodeAnswer(resp, nil)
				resp.Body.Close()
				if err == nil {
					return nil
				}
				lastErr = fmt.Errorf("%s: %w", target, err)
				var nl *NotLeaderError
				if !errors.As(err, &nl) {
					break
				}
				target = nl.Leader
			}
		}
		if err := sleepCtx(ctx, backoff(attempt)); err != nil {
			return fmt.Errorf("%w (last error: %v)", err, lastErr)
		}
	}
}

// Member is one server of the Raft configuration as status reports it.
type Member struct {
	ID           string `json:"id"`
	RaftAddr     string `json:"raft_addr"`
	HTTPAddr     string `json:"http_addr,omitempty"`
	Suffrage     string `json:"suffrage"`
	Leader       bool   `json:"leader"`
	Reachable    bool   `json:"reachable"`
	State        string `json:"state,omitempty"`
	Term         uint64 `json:"term,omitempty"`
	CommitIndex  uint64 `json:"commit_index,omitempty"`
	AppliedIndex uint64 `json:"applied_index,omitempty"`
	// LastContactMs: since the member last heard from a leader (0 = is leader, -1 = never).
	LastContactMs int64 `json:"last_contact_ms"`
	// BuildLevel is the catalog level the member's build knows (0: not
	// reachable; 1 also for a build older than levels, which does not say);
	// ClusterLevel the cluster's level as the member has applied it.
	BuildLevel   int64  `json:"build_level,omitempty"`
	ClusterLevel int64  `json:"cluster_level,omitempty"`
	Error        string `json:"error,omitempty"`
}

// SelfStatus is one node's own view.
type SelfStatus struct {
	ID            string `json:"id"`
	RaftAddr      string `json:"raft_addr"`
	HTTPAddr      string `json:"http_addr"`
	State         string `json:"state"`
	LeaderID      string `json:"leader_id"`
	LeaderAddr    string `json:"leader_raft_addr"`
	Term          uint64 `json:"term"`
	CommitIndex   uint64 `json:"commit_index"`
	AppliedIndex  uint64 `json:"applied_index"`
	LastContactMs int64  `json:"last_contact_ms"`
	Ready         bool   `json:"ready"`
	ReadyReason   string `json:"ready_reason"`
	// BuildLevel is the catalog level this node's build knows, the answer
	// to the leader's level check (level.go); ClusterLevel the cluster's
	// level as this node has applied it. Both absent from builds older
	// than levels.
	BuildLevel   int64 `json:"build_level,omitempty"`
	ClusterLevel int64 `json:"cluster_level,omitempty"`
}

// ClusterStatus is the answer of /v1/cluster/status: the asked node's view
// plus every member's own view, fetched with a short timeout.
type ClusterStatus struct {
	Self   SelfStatus `json:"self"`
	Leader string     `json:"leader"` // leader's ID
	Term   uint64     `json:"term"`
	// ClusterLevel is the cluster's catalog level as the asked node has
	// applied it (level.go).
	ClusterLevel int64    `json:"cluster_level,omitempty"`
	Members      []Member `json:"members"`
}

// Self returns this node's own view of the cluster.
func (n *Node) Self() SelfStatus {
	addr, id := n.raft.LeaderWithID()
	ready, why := n.Ready()
	lc := int64(-1)
	if s := n.staleness(); s < 1000*time.Hour {
		lc = s.Milliseconds()
	}
	return SelfStatus{
		ID: n.cfg.ID, RaftAddr: n.RaftAddr(), HTTPAddr: n.httpAddr, State: n.raft.State().String(),
		LeaderID: string(id), LeaderAddr: string(addr), Term: n.raft.CurrentTerm(),
		CommitIndex: n.raft.CommitIndex(), AppliedIndex: n.AppliedIndex(), LastContactMs: lc,
		Ready: ready, ReadyReason: why, BuildLevel: n.cat.BuildLevel(), ClusterLevel: n.cat.ClusterLevel(),
	}
}

// Status gathers the cluster's status as seen from this node.
func (n *Node) Status(ctx context.Context) (ClusterStatus, error) {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return ClusterStatus{}, err
	}
	self := n.Self()
	st := ClusterStatus{Self: self, Leader: self.LeaderID, Term: self.Term, ClusterLevel: self.ClusterLevel}
	servers := cf.Configuration().Servers
	st.Members = make([]Member, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		m := Member{ID: string(s.ID), RaftAddr: string(s.Address), Suffrage: s.Suffrage.String(), Leader: string(s.ID) == self.LeaderID, LastContactMs: -1}
		st.Members[i] = m
		wg.Add(1)
		go func(m *Member) {
			defer wg.Done()
			var ss SelfStatus
			if m.ID == n.cfg.ID {
				ss = self
			} else {
				nm, err := n.peerMeta(m.RaftAddr)
				if err != nil {
					m.Error = err.Error()
					return
				}
				m.HTTPAddr = nm.HTTPAddr
				cctx, c := context.WithTimeout(ctx, time.Second)
				defer c()
				if err := n.forward(cctx, "GET", nm, "/v1/cluster/self", nil, &ss); err != nil {
					m.Error = err.Error()
					return
				}
			}
			m.HTTPAddr, m.Reachable, m.State, m.Term = ss.HTTPAddr, true, ss.State, ss.Term
			m.CommitIndex, m.AppliedIndex, m.LastContactMs = ss.CommitIndex, ss.AppliedIndex, ss.LastContactMs
			m.BuildLevel, m.ClusterLevel = max(ss.BuildLevel, 1), ss.ClusterLevel
		}(&st.Members[i])
	}
	wg.Wait()
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].ID < st.Members[j].ID })
	return st, nil
}

// Snapshot forces a Raft snapshot on this node and returns its index.
func (n *Node) Snapshot() (uint64, error) {
	f := n.raft.Snapshot()
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNothingNewToSnapshot) {
			if meta, lerr := n.lastSnapshotMeta(); lerr == nil {
				return meta.Index, nil
			}
		}
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	meta, rc, err := f.Open()
	if err != nil {
		return 0, err
	}
	rc.Close()
	return meta.Index, nil
}

// Backup writes a consistent copy of the catalog (the FSM data of a fresh
// Raft snapshot of this node) to w and returns the snapshot's index.
func (n *Node) Backup(ctx context.Context, w io.Writer) (uint64, error) {
	meta, rc, err := n.OpenBackup(ctx)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	if _, err := io.Copy(w, rc); err != nil {
		return 0, fmt.Errorf("backup copy: %w", err)
	}
	return meta.Index, nil
}

// OpenBackup takes a Raft snapshot (or, when nothing is new since the last
// one, opens the latest) and returns a reader of its FSM data. A
// linearizable barrier first makes the copy include every write
// acknowledged before the call, on whichever node it runs.
func (n *Node) OpenBackup(ctx context.Context) (*raft.SnapshotMeta, io.ReadCloser, error) {
	if _, err := n.ReadBarrier(ctx, LinearizableRead()); err != nil {
		return nil, nil, err
	}
	f := n.raft.Snapshot()
	err := f.Error()
	if err == nil {
		return f.Open()
	}
	if !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return nil, nil, fmt.Errorf("backup snapshot: %w", err)
	}
	meta, err := n.lastSnapshotMeta()
	if err != nil {
		return nil, nil, fmt.Errorf("backup snapshot: %w", err)
	}
	return n.snaps.Open(meta.ID)
}

// Restore replaces the whole catalog with a backup (Raft user restore on
// the leader; followers receive it as an InstallSnapshot). The upload is
// spooled to a temp file in the data dir (raft needs the size up front) and
// checked whole (checkBackup: frame, checksum, a catalog of this schema
// version, integrity) before raft sees a byte: a bad file is refused with
// CodeInvalidBackup and nothing changes. Only then does raft get the same
// bytes. The checkpoint is raft.Restore returning: the restored state is
// then committed.
func (n *Node) Restore(ctx context.Context, r io.Reader) error {
	if n.raft.State() != raft.Leader {
		return n.notLeader()
	}
	tmp, err := os.CreateTemp(n.cfg.Dir, "restore-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	size, err := io.Copy(tmp, r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &fsm.Error{Code: CodeTooLarge, Message: fmt.Sprintf("backup larger than %d bytes", mbe.Limit)}
		}
		return fmt.Errorf("receive backup: %w", err)
	}
	info, err := n.checkBackup(ctx, io.NewSectionReader(tmp, 0, size), size)
	if err != nil {
		return err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Size: size}
	if err := n.raft.Restore(meta, tmp, 2*n.cfg.ApplyTimeout); err != nil {
		return n.leaderOpErr("restore", err)
	}
	n.log.Info("catalog restored from a backup", "bytes", size, "backup_index", info.AppliedIndex)
	// Raft ends a restore with its own no-op, which the catalog never sees;
	// a catalog command moves the applied index past it for read-index
	// waits, and counts the restore (fsm.CmdCatalogRestored: heartbeat
	// answers carry the count, and hosts seeing it grow republish their
	// databases' sizes, which went back to the backup's). A crash between
	// raft.Restore (the checkpoint) and this command leaves the restore
	// done but uncounted; the command then fails and the operator runs the
	// restore again (the same backup: same state), which counts it.
	cmd, _ := fsm.NewCommand(fsm.CmdCatalogRestored, ids.New(), n.cfg.Now().UnixNano(), fsm.CatalogRestored{BackupIndex: int64(info.AppliedIndex)})
	if _, err := n.applyLocal(ctx, cmd); err != nil {
		return fmt.Errorf("restore applied, post-restore marker failed (run the restore again): %w", err)
	}
	return nil
}
