package edge

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/semaphore"
)

// fallback bounds the edge's reads of the catalog on cache misses (routes,
// tokens, accounts): at most Cap in flight at once, and a circuit breaker that
// opens after consecutive catalog failures. Both fail fast with ErrUnavailable
// instead of queueing, so a mass cache purge cannot pile work onto a
// struggling catalog (the metastable-overload failure mode). Callers put a
// singleflight in front so concurrent misses of one key cost one read.
type fallback struct {
	sem      *semaphore.Weighted
	breaker  *gobreaker.CircuitBreaker[any]
	inFlight atomic.Int64
	maxSeen  atomic.Int64
	rejected atomic.Int64
	timeout  time.Duration
}

// errFallbackFull: the catalog read was refused because this edge already
// has Cap reads in flight — the catalog is busy, not unavailable, so the
// object hosts are not asked instead (hostroute.go).
var errFallbackFull = errors.New("catalog fallback at capacity")

type fallbackOptions struct {
	Cap              int64         // max concurrent catalog reads; default 64
	Timeout          time.Duration // per catalog read; default 2s
	BreakerFailures  uint32        // consecutive failures that open the breaker; default 5
	BreakerOpenFor   time.Duration // default 2s
	BreakerHalfProbe uint32        // requests allowed while half-open; default 1
}

func newFallback(o fallbackOptions) *fallback {
	if o.Cap <= 0 {
		o.Cap = 64
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.BreakerFailures == 0 {
		o.BreakerFailures = 5
	}
	if o.BreakerOpenFor <= 0 {
		o.BreakerOpenFor = 2 * time.Second
	}
	if o.BreakerHalfProbe == 0 {
		o.BreakerHalfProbe = 1
	}
	f := &fallback{sem: semaphore.NewWeighted(o.Cap), timeout: o.Timeout}
	f.breaker = gobreaker.NewCircuitBreaker[any](gobreaker.Settings{
		Name:        "catalog",
		MaxRequests: o.BreakerHalfProbe,
		Timeout:     o.BreakerOpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= o.BreakerFailures },
		// A refusal (not found, …) is a healthy catalog answering.
		IsSuccessful: func(err error) bool { return err == nil || isCatalogRefusal(err) },
	})
	return f
}

// do runs fn against the catalog under the cap and the breaker. fn runs with a
// context detached from the caller's cancellation (its result is shared by a
// singleflight) but bounded by the fallback timeout.
func (f *fallback) do(ctx context.Context, fn func(ctx context.Context) error) error {
	if !f.sem.TryAcquire(1) {
		f.rejected.Add(1)
		return fmt.Errorf("%w: %w", ErrUnavailable, errFallbackFull)
	}
	defer f.sem.Release(1)
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxSeen.Load()
		if n <= m || f.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout)
	defer cancel()
	_, err := f.breaker.Execute(func() (any, error) { return nil, fn(ctx) })
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		f.rejected.Add(1)
		return fmt.Errorf("%w: catalog circuit breaker open", ErrUnavailable)
	}
	if err != nil && !isCatalogRefusal(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}
