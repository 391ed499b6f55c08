package limiter

import (
	"context"
	"errors"
	"time"
)

// Notice is what an account is told when it crosses a daily limit.
type Notice struct {
	AccountID   string
	AccountName string
	// Limit names the limit crossed: "rows_read_per_day" or
	// "rows_written_per_day".
	Limit     string
	Value     int64     // today's total when the limiter saw it
	Threshold int64     // the account's limit
	Day       string    // YYYY-MM-DD (UTC)
	Until     time.Time // when the limit lifts: the end of the UTC day
}

// ID is "account/day": the same for every attempt at one notice, so a
// receiver can drop a duplicate delivery (a webhook retried after its
// answer was lost).
func (n Notice) ID() string { return n.AccountID + "/" + n.Day }

// Notifier delivers notices through one channel (mail, a webhook, …).
//
// Send is called from one goroutine at a time per Notifier, with a context
// that bounds the attempt; it returns nil only once the channel accepted
// the notice. A Notifier may retry within Send; the limiter retries a
// failed Send with backoff until the notice's Until, so Send must not
// assume it is called once. Name labels the channel's metrics
// (shoal_limiter_notices_sent_total{channel}).
type Notifier interface {
	Name() string
	Send(ctx context.Context, n Notice) error
}

// ErrPermanent is wrapped by a Send error that no retry can change (the
// receiver refused the request itself, the address is malformed): the
// limiter stops retrying that notice on that channel and logs it.
var ErrPermanent = errors.New("permanent failure")
