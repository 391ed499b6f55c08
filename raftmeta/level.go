package raftmeta

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// The cluster's catalog level (raftmeta/DESIGN.md, "Catalog levels"; the
// FSM side is fsm/cmd_set_cluster_level.go). The leader raises it, as
// etcd's leader raises the cluster version: it asks every server of the
// current Raft configuration, voters and non-voters, which level its
// build knows (GET /v1/cluster/self, build_level), and proposes
// set_cluster_level(min) only when every one answered within
// LevelCheckTimeout and the lowest answer is above the cluster's level.
// Any server not answering leaves the level where it is (fail closed): a
// server that cannot be asked might run an older build. A build older than
// levels answers without build_level, which counts as level 1.

// ServerLevel is one server's answer to the level question.
type ServerLevel struct {
	ID         string `json:"id"`
	BuildLevel int64  `json:"build_level,omitempty"` // 0: no answer
	Error      string `json:"error,omitempty"`
}

// errLevelUnknown: a server's level could not be learnt.
var errLevelUnknown = errors.New("catalog level unknown")

// serverLevels asks every server of the configuration for its build's
// level, concurrently, each bounded by LevelCheckTimeout. The answers are
// in server ID order; err is non-nil when any server did not answer.
func (n *Node) serverLevels(ctx context.Context) ([]ServerLevel, error) {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, err
	}
	servers := cf.Configuration().Servers
	out := make([]ServerLevel, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		out[i].ID = string(s.ID)
		wg.Add(1)
		go func(sl *ServerLevel, addr raft.ServerAddress) {
			defer wg.Done()
			l, err := n.serverLevel(ctx, sl.ID, string(addr))
			if err != nil {
				sl.Error = err.Error()
				return
			}
			sl.BuildLevel = l
		}(&out[i], s.Address)
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	var errs []error
	for _, sl := range out {
		if sl.BuildLevel == 0 {
			errs = append(errs, fmt.Errorf("%s: %s", sl.ID, sl.Error))
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%w: %w", errLevelUnknown, errors.Join(errs...))
	}
	return out, nil
}

// serverLevel asks one server (this node itself without a round trip) for
// the level its build knows: its /v1/cluster/self answer's build_level,
// 1 when the answer lacks it or the route is unknown (404: a build older
// than levels).
func (n *Node) serverLevel(ctx context.Context, id, raftAddr string) (int64, error) {
	if id == n.cfg.ID {
		return n.cat.BuildLevel(), nil
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.LevelCheckTimeout)
	defer cancel()
	nm, err := n.peerMeta(raftAddr) // bounded by its own 1 s dial timeout
	if err != nil {
		return 0, err
	}
	var ss SelfStatus
	err = n.forward(ctx, "GET", nm, "/v1/cluster/self", nil, &ss)
	var fe *fsm.Error
	switch {
	case errors.As(err, &fe) && fe.Code == fsm.CodeNotFound:
		return 1, nil
	case err != nil:
		return 0, err
	case ss.ID != "" && ss.ID != id:
		// The address now belongs to another server: not this one's answer.
		return 0, fmt.Errorf("server at %s answered as %q", raftAddr, ss.ID)
	case ss.BuildLevel < 1:
		return 1, nil
	}
	return ss.BuildLevel, nil
}

// raiseClusterLevel is one round of the leader's level check: ask every
// server, and propose set_cluster_level(min) when all answered and the
// minimum is above the cluster's level. It returns the level proposed (0
// when none was).
func (n *Node) raiseClusterLevel(ctx context.Context) (int64, error) {
	// One at a time with joins (Join holds it too): a server added between
	// the question and the proposal would not have been asked.
	n.levelMu.Lock()
	defer n.levelMu.Unlock()
	if n.raft.State() != raft.Leader {
		return 0, n.notLeader()
	}
	if n.cat.ClusterLevel() >= n.cat.BuildLevel() {
		// The lowest level any server can report is at most this
		// build's: nothing to raise, so no server is asked (the loop's
		// every-10-s round costs nothing once the cluster caught up).
		return 0, nil
	}
	levels, err := n.serverLevels(ctx)
	if err != nil {
		return 0, err
	}
	lowest := int64(-1)
	for _, sl := range levels {
		if lowest < 0 || sl.BuildLevel < lowest {
			lowest = sl.BuildLevel
		}
	}
	from := n.cat.ClusterLevel()
	if lowest <= from {
		return 0, nil
	}
	// The checkpoint is the entry's commit: until then nothing changed, and
	// a crash before it leaves the next leader's round to propose it again
	// (set_cluster_level is idempotent).
	cmd, err := fsm.NewCommand(fsm.CmdSetClusterLevel, ids.New(), n.cfg.Now().UnixNano(), fsm.SetClusterLevel{Level: lowest})
	if err != nil {
		return 0, err
	}
	actx, c := context.WithTimeout(ctx, n.cfg.ApplyTimeout)
	defer c()
	if _, err := n.applyLocal(actx, cmd); err != nil {
		return 0, fmt.Errorf("propose set_cluster_level %d: %w", lowest, err)
	}
	n.log.Info("cluster catalog level raised: every server's build knows it", "level", lowest, "servers", len(levels))
	// In the audit log too (best effort, after the checkpoint, like a
	// membership change's row: the raise stands either way).
	names := make([]string, 0, len(levels))
	for _, sl := range levels {
		names = append(names, sl.ID)
	}
	n.auditAs(fsm.Audit{Actor: "catalog-leader:" + n.cfg.ID}, "raise_cluster_level", "cluster", map[string]string{
		"from": strconv.FormatInt(from, 10), "to": strconv.FormatInt(lowest, 10), "servers": strings.Join(names, ","),
	})
	return lowest, nil
}

// levelLoop runs the level check for the node's life: as leader, every
// LevelCheckInterval and at once after gaining leadership (a new leader's
// term).
func (n *Node) levelLoop() {
	defer n.wg.Done()
	tick := time.NewTicker(min(time.Second, n.cfg.LevelCheckInterval))
	defer tick.Stop()
	var last time.Time
	var lastTerm uint64
	lastErr := ""
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-tick.C:
		}
		if n.raft.State() != raft.Leader || n.readyTerm.Load() != n.raft.CurrentTerm() {
			continue // not leader, or its term's no-op not applied yet
		}
		term := n.raft.CurrentTerm()
		if term == lastTerm && time.Since(last) < n.cfg.LevelCheckInterval {
			continue
		}
		last, lastTerm = time.Now(), term
		_, err := n.raiseClusterLevel(n.ctx)
		switch {
		case err == nil:
			lastErr = ""
		case n.ctx.Err() != nil:
		case err.Error() != lastErr: // once per distinct reason, not every round
			lastErr = err.Error()
			n.log.Warn("cluster catalog level check incomplete; level unchanged", "level", n.cat.ClusterLevel(), "err", err)
		}
	}
}

// checkJoinLevel refuses to add a server whose build knows a lower level
// than the cluster's: it would halt at the first entry or snapshot that
// carries the level (fsm.BuildTooOldError). A server that cannot be asked
// is refused too (fail closed); at level 1 every build qualifies.
func (n *Node) checkJoinLevel(ctx context.Context, r JoinRequest) error {
	cluster := n.cat.ClusterLevel()
	if cluster <= 1 {
		return nil
	}
	l, err := n.serverLevel(ctx, r.ID, r.RaftAddr)
	if err != nil {
		return fmt.Errorf("%w: cannot learn the catalog level of %q's build (the cluster is at level %d, and only a build of that level or later may join): %v",
			ErrUnavailable, r.ID, cluster, err)
	}
	if l < cluster {
		return &fsm.Error{Code: fsm.CodeClusterLevelTooLow, Message: fmt.Sprintf(
			"%q runs a build of catalog level %d, the cluster is at level %d: upgrade it to a build of level %d or later before it joins", r.ID, l, cluster, cluster)}
	}
	return nil
}
