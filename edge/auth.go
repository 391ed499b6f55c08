package edge

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

var errUnauthenticated = errors.New("authentication error")

// principal is who a request acts for.
type principal struct {
	admin     bool
	accountID string
	tokenID   string
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
type authenticator struct {
	catalog     Catalog
	fb          *fallback
	adminHash   []byte // sha256 of the admin token; nil disables admin
	ttl         time.Duration
	negativeTTL time.Duration
	staleGrace  time.Duration
	max         int
	now         func() time.Time
	group       singleflight.Group

	mu sync.Mutex
	m  map[[sha256.Size]byte]tokenEntry // keyed by the raw digest: no hex string per request
}

type tokenEntry struct {
	tok     fsm.Token
	found   bool
	fetched time.Time
}

func (a *authenticator) authenticate(ctx context.Context, authz string) (principal, error) {
	scheme, secret, ok := strings.Cut(authz, " ")
	secret = strings.TrimSpace(secret)
	if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
		return principal{}, errUnauthenticated
	}
	sum := sha256.Sum256([]byte(secret))
	if a.adminHash != nil && subtle.ConstantTimeCompare(sum[:], a.adminHash) == 1 {
		return principal{admin: true}, nil
	}
	now := a.now()
	a.mu.Lock()
	e, cached := a.m[sum]
	a.mu.Unlock()
	fresh := cached && ((e.found && now.Sub(e.fetched) < a.ttl) || (!e.found && now.Sub(e.fetched) < a.negativeTTL))
	if !fresh {
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
		case cached && e.found && now.Sub(e.fetched) < a.staleGrace:
			// Catalog unreachable: keep serving the last answer (see type doc).
		default:
			return principal{}, err
		}
	}
	if !e.found || e.tok.Revoked {
		return principal{}, errUnauthenticated
	}
	return principal{admin: e.tok.Admin, accountID: e.tok.AccountID, tokenID: e.tok.ID}, nil
}

func (a *authenticator) store(hash [sha256.Size]byte, e tokenEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) >= a.max {
		// Evict expired entries first, then arbitrary ones (map order).
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
