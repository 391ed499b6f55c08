package objecthost

import (
	"context"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Catalog is what an object host needs from the Raft catalog. raftmeta's
// client satisfies it (the binary adapts it in cmd/shoal if signatures
// drift).
//
// Concurrency contract: methods may be called concurrently from the host's
// background goroutines; the host never calls the catalog on the query path,
// so queries keep working when every catalog node is down. Implementations
// should answer Heartbeat from a follower (stale reads are fine) and cache
// account rows per account, not per database.
type Catalog interface {
	// Heartbeat returns the state of each UUID (Known=false for a UUID the
	// catalog has no row for) and, once per account seen, the account's
	// limits and drained storage total. The host sends at most
	// Config.HeartbeatBatch UUIDs per call. A UUID missing from the answer
	// is treated as "no news", never as unknown.
	Heartbeat(ctx context.Context, uuids []string) (fsm.HeartbeatAnswer, error)
	// RegisterHost records this host (address, region, jurisdiction,
	// capacity). Called at start until it succeeds; must be idempotent.
	RegisterHost(ctx context.Context, h fsm.RegisterHost) error
	// ReportHostLoad records the host's database count and bytes on disk.
	ReportHostLoad(ctx context.Context, l fsm.ReportHostLoad) error
}
