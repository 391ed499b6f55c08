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

	mu  sync.Mutex
	m   map[[sha256.Size]byte]tokenEntry // validated tokens, keyed by the raw digest: no hex string per request
	neg map[[sha256.Size]byte]time.Time  // unknown digests → when the catalog said so
}

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
	e, err := a.lookup(ctx, sum)
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
func (a *authenticator) lookup(ctx context.Context, sum [sha256.Size]byte) (tokenEntry, error) {
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
	if !cached {
		// Not a token this edge validated: capped, so a flood of random
		// tokens cannot take the fallback's whole capacity.
		if !a.unknown.TryAcquire(1) {
			return tokenEntry{}, errTokenLookupsBusy
		}
		defer a.unknown.Release(1)
	}
	hash := hex.EncodeToString(sum[:])
	v, err, _ := a.group.Do(hash, func() (any, error) {
		var tok fsm.Token
		err := a.fb.do(ctx, func(ctx context.Context) error {
			var err error
			tok, err = a.catalog.TokenByHash(ctx, hash)
			return err
		})
		switch {
		case err == nil:
			return tokenEntry{tok: tok, found: true, fetched: a.now()}, nil
		case errors.Is(err, fsm.ErrNotFound):
			return tokenEntry{fetched: a.now()}, nil
		}
		return nil, err
	})
	switch {
	case err == nil:
		e = v.(tokenEntry)
		a.store(sum, e)
		return e, nil
	case cached && now.Sub(e.fetched) < a.staleGrace:
		// Catalog unreachable: keep serving the last answer (see type doc).
		return e, nil
	}
	return tokenEntry{}, err
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
	e, err := a.lookup(ctx, sum)
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
