package limiter

import (
	"context"
	"time"

	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Catalog is what the limiter needs of the catalog: an account's tier and
// limits, and Apply for the claim_limit_notice command. Both may be called
// from several goroutines at once; Apply must keep a command's RequestID
// across its own retries (raftmeta.Client does), because the claim's
// answer to a retried proposal is the original answer only under the same
// RequestID.
type Catalog interface {
	Account(ctx context.Context, id string, o raftmeta.ReadOptions) (fsm.Account, error)
	Apply(ctx context.Context, cmd fsm.Command) (fsm.Result, error)
}

var (
	_ Catalog = (*raftmeta.Client)(nil)
	_ Usage   = (*chsink.Store)(nil)
)

// Usage is the limiter's question to ClickHouse: the accounts whose usage
// on the UTC day of day exceeds maxRead rows read or maxWritten rows
// written. *chsink.Store implements it. Safe for concurrent use.
type Usage interface {
	AccountsOver(ctx context.Context, day time.Time, maxRead, maxWritten int64) ([]chsink.AccountTotals, error)
}
