// Package binding signs and verifies binding tokens: credentials scoped to one
// database that carry the database's route, so a request bearing one goes from
// the edge straight to the object host with no route lookup and no catalog
// access at all (the data plane's "binding path").
//
// A token is
//
//	"v1." + base64url(JSON claims) + "." + base64url(HMAC-SHA256(key, "v1." + base64url(JSON claims)))
//
// The edge mints tokens (Sign); the object host verifies them (Verify) and, in
// addition, checks that the object named by the claims really belongs to the
// claimed database and account and that the routing generation matches its
// own — the signature proves the edge issued the route, the object's own
// metadata proves the route is still true.
//
// Tokens are bearer credentials: anyone holding one may query the database
// until it expires. Keys come from configuration and are shared by every edge
// and object host; a Keyring verifies against the current key and any number
// of previous keys so keys can be rotated without invalidating live tokens.
package binding

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Scheme is the Authorization scheme of binding tokens:
// "Authorization: Binding <token>".
const Scheme = "Binding"

// MinKeyLen is the shortest HMAC key accepted. HMAC-SHA256 keys shorter than
// the hash output weaken the MAC; 32 bytes is the recommended size.
const MinKeyLen = 32

// MaxTokenLen bounds the token text Verify is willing to decode, so a hostile
// header costs nothing.
const MaxTokenLen = 2048

const version = "v1"

// Errors Verify returns, wrapped with %w; callers branch with errors.Is. All of
// them mean "reject the request" — they differ only for logs and metrics.
var (
	ErrMalformed    = errors.New("malformed binding token")
	ErrBadSignature = errors.New("binding token signature mismatch")
	ErrExpired      = errors.New("binding token expired")
	ErrKeyTooShort  = errors.New("binding key too short")
	ErrInvalidClaim = errors.New("invalid binding token claims")
	ErrNoToken      = errors.New("no binding token")
)

// Claims is what a token asserts: the route of one database and until when.
// Field names are short because the token travels in every request header.
type Claims struct {
	DatabaseUUID string `json:"d"` // canonical lowercase UUID
	ObjectID     string `json:"o"` // 32 hex chars
	AccountID    string `json:"a"`
	HostAddress  string `json:"h"` // host:port of the object host holding the object
	Generation   int64  `json:"g"` // routing generation the route was read at
	IssuedAt     int64  `json:"iat"`
	ExpiresAt    int64  `json:"exp"` // Unix seconds; the token is invalid at and after this instant
}

// Expiry returns ExpiresAt as a time.
func (c Claims) Expiry() time.Time { return time.Unix(c.ExpiresAt, 0) }

func (c Claims) validate() error {
	switch {
	case c.DatabaseUUID == "":
		return fmt.Errorf("%w: database uuid missing", ErrInvalidClaim)
	case c.ObjectID == "":
		return fmt.Errorf("%w: object id missing", ErrInvalidClaim)
	case c.AccountID == "":
		return fmt.Errorf("%w: account id missing", ErrInvalidClaim)
	case c.HostAddress == "":
		return fmt.Errorf("%w: host address missing", ErrInvalidClaim)
	case c.ExpiresAt <= 0:
		return fmt.Errorf("%w: expiry missing", ErrInvalidClaim)
	}
	return nil
}

// Keyring holds the signing key and the keys still accepted for verification.
// It is immutable after construction and safe for concurrent use.
type Keyring struct {
	current  []byte
	previous [][]byte
}

// NewKeyring returns a keyring that signs with current and verifies against
// current and every previous key. Every key must be at least MinKeyLen bytes.
func NewKeyring(current []byte, previous ...[]byte) (*Keyring, error) {
	if len(current) < MinKeyLen {
		return nil, fmt.Errorf("%w: %d bytes, need %d", ErrKeyTooShort, len(current), MinKeyLen)
	}
	k := &Keyring{current: append([]byte(nil), current...)}
	for _, p := range previous {
		if len(p) < MinKeyLen {
			return nil, fmt.Errorf("%w: previous key of %d bytes, need %d", ErrKeyTooShort, len(p), MinKeyLen)
		}
		k.previous = append(k.previous, append([]byte(nil), p...))
	}
	return k, nil
}

// Sign returns the token for c, signed with the current key.
func (k *Keyring) Sign(c Claims) (string, error) {
	if err := c.validate(); err != nil {
		return "", err
	}
	body, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode binding claims: %w", err)
	}
	signed := version + "." + base64.RawURLEncoding.EncodeToString(body)
	return signed + "." + base64.RawURLEncoding.EncodeToString(mac(k.current, signed)), nil
}

// Verify checks the token's signature against every key in the ring and its
// expiry against now, and returns its claims. It does not check the claims
// against any object: that is the object host's job.
func (k *Keyring) Verify(token string, now time.Time) (Claims, error) {
	if len(token) > MaxTokenLen {
		return Claims{}, fmt.Errorf("%w: %d bytes", ErrMalformed, len(token))
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != version {
		return Claims{}, ErrMalformed
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != sha256.Size {
		return Claims{}, ErrMalformed
	}
	signed := parts[0] + "." + parts[1]
	ok := hmac.Equal(sig, mac(k.current, signed))
	for _, p := range k.previous {
		if ok {
			break
		}
		ok = hmac.Equal(sig, mac(p, signed))
	}
	if !ok {
		return Claims{}, ErrBadSignature
	}
	// Only decode claims once the signature proved the edge wrote them.
	body, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return Claims{}, ErrMalformed
	}
	var c Claims
	if err := json.Unmarshal(body, &c); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := c.validate(); err != nil {
		return Claims{}, err
	}
	if !now.Before(c.Expiry()) {
		return Claims{}, fmt.Errorf("%w at %s", ErrExpired, c.Expiry().UTC().Format(time.RFC3339))
	}
	return c, nil
}

// FromHeader extracts the token of an "Authorization: Binding <token>" header.
// The scheme is matched case-insensitively, as HTTP auth schemes are.
func FromHeader(h http.Header) (string, error) {
	v := h.Get("Authorization")
	scheme, tok, found := strings.Cut(v, " ")
	if !found || !strings.EqualFold(scheme, Scheme) {
		return "", ErrNoToken
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", ErrNoToken
	}
	return tok, nil
}

// SetHeader sets "Authorization: Binding <token>" on h.
func SetHeader(h http.Header, token string) { h.Set("Authorization", Scheme+" "+token) }

func mac(key []byte, signed string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(signed))
	return m.Sum(nil)
}

// MinSecretLen is the shortest configured secret KeyringFromSecrets accepts.
const MinSecretLen = 16

// KeyringFromSecrets builds a keyring from configured secrets (cluster.hcl's
// secrets.binding_key, flags): each key is SHA-256("shoal-binding-v1\x00" +
// secret), so any secret of at least MinSecretLen bytes yields a full-size
// HMAC key. Every edge and object host must build its keyring this way from
// the same secrets.
func KeyringFromSecrets(current string, previous ...string) (*Keyring, error) {
	derive := func(s string) ([]byte, error) {
		if len(s) < MinSecretLen {
			return nil, fmt.Errorf("%w: secret of %d bytes, need %d", ErrKeyTooShort, len(s), MinSecretLen)
		}
		h := sha256.Sum256([]byte("shoal-binding-v1\x00" + s))
		return h[:], nil
	}
	cur, err := derive(current)
	if err != nil {
		return nil, err
	}
	var prev [][]byte
	for _, p := range previous {
		k, err := derive(p)
		if err != nil {
			return nil, err
		}
		prev = append(prev, k)
	}
	return NewKeyring(cur, prev...)
}
