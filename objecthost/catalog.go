package objecthost

import (
	"context"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Catalog is what an object host needs from the Raft catalog. raftmeta's
// client satisfies it through RaftmetaCatalog.
//
// Concurrency contract: methods may be called concurrently from the host's
// background goroutines; the host never calls the catalog on the query path,
// so queries keep working when every catalog node is down. Implementations
// should answer Heartbeat from a follower (stale reads are fine) and cache
// account rows per account, not per database.
//
// Destruction contract: a stale answer may repair a route, confirm a
// database or tell that one was deleted (deletion is final in the catalog
// and a UUID is never reused, so a stale "deleted" is still true), but it
// never kills an object on its own. The host deletes an object the catalog
// does not know only when ConfirmHeartbeat — a linearizable read, which
// observes every catalog write acknowledged before it — also answers
// unknown, the object is past the creation grace and was never confirmed
// active, the pass is not a mass of such verdicts (see Config.
// OrphanMassFloor), and FenceOrphans then fences the UUID (a create for it
// still in flight can no longer commit). Anything else is held and raises
// an alarm.
type Catalog interface {
	// Heartbeat returns the state of each UUID (Known=false for a UUID the
	// catalog has no row for, as far as the serving replica knows) and, once
	// per account seen, the account's limits and drained storage total. It
	// may be served by a follower, bounded in time and log position. The
	// host sends at most Config.HeartbeatBatch UUIDs per call. A UUID
	// missing from the answer is treated as "no news", never as unknown.
	Heartbeat(ctx context.Context, uuids []string) (fsm.HeartbeatAnswer, error)
	// ConfirmHeartbeat answers like Heartbeat but linearizably: Known=false
	// means no catalog row exists for the UUID as of a moment after the call
	// started. The host calls it only for the UUIDs a Heartbeat answered
	// unknown past the creation grace, before it deletes anything.
	ConfirmHeartbeat(ctx context.Context, uuids []string) (fsm.HeartbeatAnswer, error)
	// FenceOrphans makes the catalog refuse any future create of these
	// UUIDs (a catalog write, fsm.CmdFenceOrphans) and answers which are
	// fenced — the only ones the host may delete — and which turned out
	// to exist after all (a create that committed after the confirming
	// read: keep the object). The host calls it after ConfirmHeartbeat and
	// the mass brake, with at most one pass's orphans.
	FenceOrphans(ctx context.Context, hostID string, uuids []string) (fsm.FenceAnswer, error)
	// RegisterHost records this host (address, region, jurisdiction,
	// capacity). Called at start until it succeeds; must be idempotent.
	RegisterHost(ctx context.Context, h fsm.RegisterHost) error
	// ReportHostLoad records the host's database count and bytes on disk.
	ReportHostLoad(ctx context.Context, l fsm.ReportHostLoad) error
}

// HostLister is the optional part of Catalog that the bucket-wide sweep of
// deleted databases' archives needs to pick one host to run it
// (archivesweep.go), discovered by type assertion (RaftmetaCatalog has it;
// a stale answer is fine: two hosts running the same pass delete the same
// archives, each decision still on a linearizable read).
type HostLister interface {
	Hosts(ctx context.Context) ([]fsm.Host, error)
}

// RelocationCatalog is the optional part of Catalog that lost-host
// recovery needs, discovered by type assertion (RaftmetaCatalog has it). A
// catalog without it never lets the host delete a relocation's leftover
// (held, alarm) nor tells it that it was declared lost.
type RelocationCatalog interface {
	// FenceObjects makes the catalog refuse any future relocation to
	// these objects (fsm.CmdFenceOrphans' object form) and answers which
	// are fenced (the host may delete them) and which the catalog names
	// after all (a relocation that committed after the confirming read:
	// keep them).
	FenceObjects(ctx context.Context, hostID string, objs []fsm.ObjectRef) (fsm.FenceAnswer, error)
	// RegisterHostState is RegisterHost answering the host's row as the
	// catalog keeps it: State "lost" when an operator declared the host
	// lost (its registration cannot clear that).
	RegisterHostState(ctx context.Context, h fsm.RegisterHost) (fsm.Host, error)
}
