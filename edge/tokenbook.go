package edge

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Validated tokens survive a restart of the edge: the authenticator's
// answers from the catalog are kept in the route cache's bbolt file
// (bucket "tokens": the token's raw SHA-256 digest → its catalog row and
// when it was read), so an edge restarted while the catalog is down still
// serves the tokens it validated within TokenStaleGrace — exactly what it
// would have done without the restart (auth.go). Without this, a
// restarted edge could route a query through the object hosts
// (hostroute.go) but not authenticate it.
//
// What is on disk is what the catalog itself stores (the digest, never the
// secret) plus the row's account, scope and flags. A row is written when
// it is new or changed, and otherwise at most once per tokenSaveEvery per
// token, so the grace after a restart counts from at most that much
// earlier than in memory (a little shorter, never longer). A catalog
// answer that the token is unknown removes it; a revoked row is stored as
// revoked. Rows older than the grace are dropped at load.
var tokensBucket = []byte("tokens")

// tokenSaveEvery bounds the writes of an unchanged token row.
const tokenSaveEvery = time.Minute

type savedToken struct {
	Token   fsm.Token `json:"t"`
	Fetched int64     `json:"f"` // Unix ns
}

// saveToken stores a validated token row read from the catalog at fetched.
func (c *RouteCache) saveToken(sum [sha256.Size]byte, tok fsm.Token, fetched time.Time) error {
	v, err := json.Marshal(savedToken{Token: tok, Fetched: fetched.UnixNano()})
	if err != nil {
		return err
	}
	if err := c.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(tokensBucket).Put(sum[:], v) }); err != nil {
		return fmt.Errorf("token book: %w", err)
	}
	return nil
}

// dropToken removes a token row (the catalog does not know it, or it was
// revoked through this edge).
func (c *RouteCache) dropToken(sum [sha256.Size]byte) error {
	if err := c.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(tokensBucket).Delete(sum[:]) }); err != nil {
		return fmt.Errorf("token book: %w", err)
	}
	return nil
}

// loadTokens returns the stored rows read at or after notBefore (at most
// max of them) and deletes the others.
func (c *RouteCache) loadTokens(notBefore time.Time, max int) (map[[sha256.Size]byte]tokenEntry, error) {
	out := make(map[[sha256.Size]byte]tokenEntry)
	err := c.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(tokensBucket)
		var old [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var st savedToken
			if len(k) != sha256.Size || json.Unmarshal(v, &st) != nil || st.Fetched < notBefore.UnixNano() || len(out) >= max {
				old = append(old, append([]byte(nil), k...))
				return nil
			}
			var sum [sha256.Size]byte
			copy(sum[:], k)
			at := time.Unix(0, st.Fetched)
			out[sum] = tokenEntry{tok: st.Token, found: true, fetched: at, saved: at}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("token book: %w", err)
	}
	return out, nil
}
