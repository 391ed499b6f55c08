package objecthost

import (
	"context"
	"fmt"

	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// RaftmetaCatalog adapts a raftmeta.Client to Catalog: heartbeats are stale
// (follower) reads — the design brief's "served from followers", bounded in
// time and log position by the serving node — confirmations of unknown
// UUIDs are linearizable reads, and
// registration and load reports are writes whose returned rows the host does
// not need.
type RaftmetaCatalog struct {
	C *raftmeta.Client
}

var (
	_ Catalog           = RaftmetaCatalog{}
	_ AccountReader     = RaftmetaCatalog{}
	_ RelocationCatalog = RaftmetaCatalog{}
	_ DigestCatalog     = RaftmetaCatalog{}
)

// Account reads an account from a follower through the client's cache
// keyed by account (cache_ttl): the storage refresh of every database of
// one account shares it.
func (a RaftmetaCatalog) Account(ctx context.Context, id string) (fsm.Account, error) {
	return a.C.Account(ctx, id, raftmeta.StaleRead())
}

func (a RaftmetaCatalog) Heartbeat(ctx context.Context, uuids []string) (fsm.HeartbeatAnswer, error) {
	// Followers first: heartbeats are the bulk of the catalog's read load
	// (every database every 30 s), and the leader also serves every write.
	return a.C.Heartbeat(ctx, uuids, raftmeta.ReadOptions{Consistency: raftmeta.Stale, PreferFollowers: true})
}

// HeartbeatDigests is DigestCatalog, served like Heartbeat (stale,
// followers first). A node of an older build answers the route 404:
// ErrDigestsUnsupported.
func (a RaftmetaCatalog) HeartbeatDigests(ctx context.Context, q fsm.DigestQuery) (fsm.DigestAnswer, error) {
	ans, err := a.C.HeartbeatDigests(ctx, q, raftmeta.ReadOptions{Consistency: raftmeta.Stale, PreferFollowers: true})
	if raftmeta.IsDigestsUnsupported(err) {
		return ans, fmt.Errorf("%w: %v", ErrDigestsUnsupported, err)
	}
	return ans, err
}

func (a RaftmetaCatalog) ConfirmHeartbeat(ctx context.Context, uuids []string) (fsm.HeartbeatAnswer, error) {
	return a.C.Heartbeat(ctx, uuids, raftmeta.LinearizableRead())
}

// Hosts is HostLister, served by any node (a stale answer is fine there).
func (a RaftmetaCatalog) Hosts(ctx context.Context) ([]fsm.Host, error) {
	return a.C.Hosts(ctx, raftmeta.ReadOptions{Consistency: raftmeta.Stale, PreferFollowers: true})
}

func (a RaftmetaCatalog) FenceOrphans(ctx context.Context, hostID string, uuids []string) (fsm.FenceAnswer, error) {
	return a.C.FenceOrphans(ctx, fsm.FenceOrphans{HostID: hostID, UUIDs: uuids})
}

func (a RaftmetaCatalog) FenceObjects(ctx context.Context, hostID string, objs []fsm.ObjectRef) (fsm.FenceAnswer, error) {
	return a.C.FenceOrphans(ctx, fsm.FenceOrphans{HostID: hostID, Objects: objs})
}

func (a RaftmetaCatalog) RegisterHostState(ctx context.Context, h fsm.RegisterHost) (fsm.Host, error) {
	return a.C.RegisterHost(ctx, h)
}

func (a RaftmetaCatalog) RegisterHost(ctx context.Context, h fsm.RegisterHost) error {
	_, err := a.C.RegisterHost(ctx, h)
	return err
}

func (a RaftmetaCatalog) ReportHostLoad(ctx context.Context, l fsm.ReportHostLoad) error {
	_, err := a.C.ReportHostLoad(ctx, l)
	return err
}
