package edge

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

var (
	errUnauthenticated = errors.New("authentication error")
	errTokenExpired    = errors.New("token expired")
)

// principal is who a request acts for.
type principal struct {
	admin     bool
	accountID string
	tokenID   string
	tokenHash string // hex SHA-256 of the bearer token (a binding token's parent)
	// operator: the configured admin token (the only credential of
	// /admin/v1; a catalog token's admin flag does not make an operator).
	operator bool
	// readOnly: a D1 Read token (scope "read"): no statement that writes,
	// no control-plane change (scope.go).
	readOnly bool
	// databases, when not empty, are the only databases (UUIDs) the token
	// may see or touch.
	databases []string
}

// HashToken is how token secrets are stored in the catalog: hex SHA-256.
func HashToken(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// authenticator checks bearer tokens against the catalog through a local
// cache. A successful check is trusted for TTL (default 10 s): a revoked token
// keeps working for at most that long. When the catalog cannot be reached, a
// token already validated keeps working for StaleGrace (default 15 min) so
// that queries survive a catalog outage; revocation cannot be learned during
// an outage anyway. Unknown tokens are remembered for NegativeTTL so a client
// hammering with a bad token costs one catalog read per interval.
//
// Validated tokens and unknown ones live in separate maps: a flood of random
// tokens fills only the negative map (bounded by maxNegative, evicting only
// its own entries) and can never evict a validated token, which must keep
// working through a later catalog outage. Lookups of tokens the edge has not
// validated are also capped (unknownLookups in flight; more answer 503
// "retry"), so a flood cannot take the whole fallback capacity from route
// misses and token refreshes.
//
// While the catalog is unreachable (a lookup found it so less than
// unreachableFor ago, and none has had an answer since), a check that has
// an answer without it — a validated token within its stale grace, or a
// binding token's parent (served when the catalog cannot say) — answers at
// once and looks the token up in the background (one lookup per token at a
// time: the singleflight), instead of each request waiting out the
// fallback's timeout until its breaker opens. The first answer from the
// catalog ends that state and is stored as usual, so a revocation is
// learned at the first lookup the catalog answers, as before. Checks with
// no answer without the catalog (tokens this edge never validated) still
// wait for it.
type authenticator struct {
	catalog     Catalog
	fb          *fallback
	adminHash   []byte // sha256 of the admin token; nil disables admin
	ttl         time.Duration
	negativeTTL time.Duration
	staleGrace  time.Duration
	max         int // validated tokens kept
	maxNegative int // unknown tokens remembered
	now         func() time.Time
	group       singleflight.Group
	unknown     *semaphore.Weighted // lookups of digests not in m

	// unreachableFor: how long after a lookup found the catalog
	// unreachable the checks that can answer without it stop waiting for
	// it (default defaultUnreachableFor); unreachableAt is when (Unix
	// nanoseconds on now), 0 once the catalog answered again.
	unreachableFor time.Duration
	unreachableAt  atomic.Int64

	mu  sync.Mutex
	m   map[[sha256.Size]byte]tokenEntry // validated tokens, keyed by the raw digest: no hex string per request
	neg map[[sha256.Size]byte]time.Time  // unknown digests → when the catalog said so
}

// defaultUnreachableFor is authenticator.unreachableFor's default: each
// background lookup that fails renews it, so it lasts as long as the outage
// while checks keep coming, and a quiet edge probes with a request again
// after it.
const defaultUnreachableFor = 5 * time.Second

type tokenEntry struct {
	tok     fsm.Token
	found   bool
	fetched time.Time
}

// errTokenLookupsBusy: too many lookups of unknown tokens in flight (503).
var errTokenLookupsBusy = fmt.Errorf("%w: too many token checks in flight", ErrUnavailable)

func (a *authenticator) authenticate(ctx context.Context, authz string) (principal, error) {
	scheme, secret, ok := strings.Cut(authz, " ")
	secret = strings.TrimSpace(secret)
	if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
		return principal{}, errUnauthenticated
	}
	sum := sha256.Sum256([]byte(secret))
	if a.adminHash != nil && subtle.ConstantTimeCompare(sum[:], a.adminHash) == 1 {
		return principal{admin: true, operator: true, tokenHash: hex.EncodeToString(sum[:])}, nil
	}
	e, err := a.lookup(ctx, sum, false)
	if err != nil {
		return principal{}, err
	}
	if !e.found || e.tok.Revoked {
		return principal{}, errUnauthenticated
	}
	if e.tok.ExpiresAt > 0 && a.now().UnixNano() >= e.tok.ExpiresAt {
		return principal{}, errTokenExpired
	}
	return principal{admin: e.tok.Admin, accountID: e.tok.AccountID, tokenID: e.tok.ID, tokenHash: hex.EncodeToString(sum[:]),
		readOnly: e.tok.Scope == fsm.ScopeRead, databases: e.tok.Databases}, nil
}

// lookup returns what the catalog says of a token digest, through the
// caches: a fresh answer, else the catalog's (errors: unavailable), else a
// validated answer within the stale grace while the catalog is unreachable.
// tolerant: the caller serves without an answer when the catalog is
// unavailable (a binding token's parent), so while the catalog is known to
// be unreachable it need not wait for it either (see the type's doc).
func (a *authenticator) lookup(ctx context.Context, sum [sha256.Size]byte, tolerant bool) (tokenEntry, error) {
	now := a.now()
	a.mu.Lock()
	e, cached := a.m[sum]
	negAt, negative := a.neg[sum]
	a.mu.Unlock()
	if cached && now.Sub(e.fetched) < a.ttl {
		return e, nil
	}
	if !cached && negative && now.Sub(negAt) < a.negativeTTL {
		return tokenEntry{}, nil
	}
	hash := hex.EncodeToString(sum[:])
	stale := cached && now.Sub(e.fetched) < a.staleGrace
	if (stale || tolerant) && a.catalogUnreachable(now) {
		a.lookupInBackground(sum, hash, cached)
		if stale {
			return e, nil
		}
		return tokenEntry{}, errCatalogUnreachable
	}
	if !cached {
		// Not a token this edge validated: capped, so a flood of random
		// tokens cannot take the fallback's whole capacity.
		if !a.unknown.TryAcquire(1) {
			return tokenEntry{}, errTokenLookupsBusy
		}
		defer a.unknown.Release(1)
	}
	v, err, _ := a.group.Do(hash, func() (any, error) { return a.fetch(ctx, sum, hash) })
	switch {
	case err == nil:
		return v.(tokenEntry), nil
	case stale:
		// Catalog unreachable: keep serving the last answer (see type doc).
		return e, nil
	}
	return tokenEntry{}, err
}

// errCatalogUnreachable answers a tolerant lookup while the catalog is
// known to be unreachable.
var errCatalogUnreachable = fmt.Errorf("%w: catalog unreachable", ErrUnavailable)

// fetch asks the catalog about a digest through the fallback and stores
// the answer; it notes whether the catalog was reachable.
func (a *authenticator) fetch(ctx context.Context, sum [sha256.Size]byte, hash string) (tokenEntry, error) {
	var tok fsm.Token
	err := a.fb.do(ctx, func(ctx context.Context) error {
		var err error
		tok, err = a.catalog.TokenByHash(ctx, hash)
		return err
	})
	var e tokenEntry
	switch {
	case err == nil:
		e = tokenEntry{tok: tok, found: true, fetched: a.now()}
	case errors.Is(err, fsm.ErrNotFound):
		e = tokenEntry{fetched: a.now()}
	case errors.Is(err, ErrUnavailable):
		a.unreachableAt.Store(max(a.now().UnixNano(), 1))
		return tokenEntry{}, err
	default:
		return tokenEntry{}, err
	}
	a.unreachableAt.Store(0)
	a.store(sum, e)
	return e, nil
}

// catalogUnreachable reports whether a lookup found the catalog
// unreachable within unreachableFor of now, with no answer since.
func (a *authenticator) catalogUnreachable(now time.Time) bool {
	at := a.unreachableAt.Load()
	return at != 0 && now.UnixNano()-at < int64(a.unreachableFor)
}

// lookupInBackground starts a lookup of the digest unless one is in flight
// (the singleflight), without waiting for it. Its goroutine ends with the
// fallback's timeout at the latest. A digest this edge never validated
// takes a slot of the unknown-token cap, or is not looked up.
func (a *authenticator) lookupInBackground(sum [sha256.Size]byte, hash string, cached bool) {
	// DoChan's channel is buffered: nobody need read it.
	a.group.DoChan(hash, func() (any, error) {
		if !cached {
			if !a.unknown.TryAcquire(1) {
				return nil, errTokenLookupsBusy
			}
			defer a.unknown.Release(1)
		}
		return a.fetch(context.Background(), sum, hash)
	})
}

// store remembers a catalog answer: a token in m, an unknown digest in neg.
func (a *authenticator) store(hash [sha256.Size]byte, e tokenEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !e.found {
		if len(a.neg) >= a.maxNegative {
			// Only negative entries are evicted for a negative one:
			// expired first, then arbitrary ones (map order).
			for k, at := range a.neg {
				if e.fetched.Sub(at) >= a.negativeTTL || len(a.neg) >= a.maxNegative {
					delete(a.neg, k)
				}
				if len(a.neg) < a.maxNegative*3/4 {
					break
				}
			}
		}
		a.neg[hash] = e.fetched
		return
	}
	delete(a.neg, hash)
	if len(a.m) >= a.max {
		// Only real tokens get here: evict those past the stale grace
		// first, then arbitrary ones.
		now := a.now()
		for k, old := range a.m {
			if now.Sub(old.fetched) >= a.staleGrace || len(a.m) >= a.max {
				delete(a.m, k)
			}
			if len(a.m) < a.max*3/4 {
				break
			}
		}
	}
	a.m[hash] = e
}

// forget drops a token from the cache (after a revoke through this edge);
// hash is hex SHA-256 as HashToken returns it.
func (a *authenticator) forget(hash string) {
	var k [sha256.Size]byte
	if b, err := hex.DecodeString(hash); err == nil && len(b) == len(k) {
		copy(k[:], b)
		a.mu.Lock()
		delete(a.m, k)
		a.mu.Unlock()
	}
}

// parentValid checks the bearer token that minted a binding token (its hex
// SHA-256, binding.Claims.Parent) as a bearer check would: the binding
// token dies with it, within TokenTTL (the admin token's: when it is
// replaced). When the catalog cannot say (it is unreachable and this edge
// never validated that token), the binding token is served: the binding
// path never needs the catalog (docs/security.md, "Binding tokens", bounds
// this).
func (a *authenticator) parentValid(ctx context.Context, parent string) error {
	var sum [sha256.Size]byte
	if b, err := hex.DecodeString(parent); err != nil || len(b) != len(sum) {
		return errUnauthenticated
	} else {
		copy(sum[:], b)
	}
	if a.adminHash != nil && subtle.ConstantTimeCompare(sum[:], a.adminHash) == 1 {
		return nil
	}
	e, err := a.lookup(ctx, sum, true)
	switch {
	case errors.Is(err, ErrUnavailable):
		return nil
	case err != nil:
		return err
	case !e.found || e.tok.Revoked:
		return errBindingParentRevoked
	}
	return nil
}

// errBindingParentRevoked: the API token that minted a binding token was
// revoked (or never existed).
var errBindingParentRevoked = errors.New("binding token revoked: the API token that minted it was revoked")
