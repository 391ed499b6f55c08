// Package binding seals and opens binding tokens: credentials scoped to one
// database that carry the database's route, so a request bearing one goes
// from the edge straight to the object host with no route lookup and no
// catalog access at all (the data plane's "binding path").
//
// A token is
//
//	"v2." + base64url(nonce ‖ AES-256-GCM(key, JSON claims, additional data "v2"))
//
// sealed with the Go standard library's AES-GCM (a random 96-bit nonce per
// token, cipher.NewGCMWithRandomNonce; the 256-bit key is derived from the
// configured key material with HKDF-SHA256). The holder can neither read
// the claims (the object host's internal address, the object ID, the token
// ID) nor change them: any change fails authentication. The edge mints
// tokens (Sign); the edge and the object host both open them (Verify), and
// the host in addition checks the claims against the object's own metadata:
// the database, the account, the routing generation, and the object's
// revocations (an epoch per database, a list of revoked token IDs; see
// objecthost/bindings.go). Tokens minted by the first version ("v1.",
// HMAC-signed, readable claims) are refused.
//
// Tokens are bearer credentials: anyone holding one may query the database
// until it expires or is revoked. Keys come from configuration and are
// shared by every edge and object host; a Keyring opens tokens sealed with
// the current key and any number of previous keys so keys can be rotated
// without invalidating live tokens. Rotate a key well before it has sealed
// 2^32 tokens (the random-nonce bound of AES-GCM).
package binding

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
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

// MinKeyLen is the shortest key material NewKeyring accepts.
const MinKeyLen = 32

// MaxTokenLen bounds the token text Verify is willing to decode, so a hostile
// header costs nothing.
const MaxTokenLen = 2048

const (
	version = "v2"
	prefix  = version + "."
	// hkdfInfo separates the sealing key from any other use of the
	// configured material.
	hkdfInfo = "shoal binding token v2 aes-256-gcm"
)

// Errors Verify returns, wrapped with %w; callers branch with errors.Is. All of
// them mean "reject the request" — they differ only for logs and metrics.
var (
	ErrMalformed    = errors.New("malformed binding token")
	ErrBadSignature = errors.New("binding token not sealed by this cluster's key (tampered, or another cluster's)")
	ErrExpired      = errors.New("binding token expired")
	ErrKeyTooShort  = errors.New("binding key too short")
	ErrInvalidClaim = errors.New("invalid binding token claims")
	ErrNoToken      = errors.New("no binding token")
)

// Claims is what a token asserts: the route of one database, until when, and
// what revokes it. Field names are short because the token travels in every
// request header.
type Claims struct {
	DatabaseUUID string `json:"d"` // canonical lowercase UUID
	ObjectID     string `json:"o"` // 32 hex chars
	AccountID    string `json:"a"`
	HostAddress  string `json:"h"` // host:port of the object host holding the object
	Generation   int64  `json:"g"` // routing generation the route was read at
	IssuedAt     int64  `json:"iat"`
	ExpiresAt    int64  `json:"exp"` // Unix seconds; the token is invalid at and after this instant
	// TokenID names the token for revocation (NewTokenID: 32 hex chars).
	TokenID string `json:"i"`
	// Epoch is the database's binding epoch when the token was minted; the
	// object host refuses tokens below its current epoch (revoke all).
	Epoch int64 `json:"e"`
	// Parent is the hex SHA-256 of the bearer token that minted it (an
	// API token, or the operator's admin token): the edge refuses the
	// binding token once that token is revoked or, for the admin token,
	// replaced.
	Parent string `json:"p"`
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
	case !ValidTokenID(c.TokenID):
		return fmt.Errorf("%w: token id missing or malformed", ErrInvalidClaim)
	case c.Parent == "":
		return fmt.Errorf("%w: parent missing", ErrInvalidClaim)
	}
	return nil
}

// NewTokenID returns a fresh random token ID (128 bits, 32 hex chars).
func NewTokenID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics instead)
	return hex.EncodeToString(b[:])
}

// ValidTokenID reports whether s has the shape of a token ID: 32 lowercase
// hex characters.
func ValidTokenID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Keyring holds the sealing key and the keys still accepted for opening.
// It is immutable after construction and safe for concurrent use.
type Keyring struct {
	current  cipher.AEAD
	previous []cipher.AEAD
	material []byte // the current key material, for DeriveKey
}

// DeriveKey returns a 32-byte key for another purpose (say, signing
// download URLs), derived from the current key material with HKDF-SHA256
// and purpose as its info: the same on every process with the same keys,
// unrelated to the sealing key and to other purposes' keys.
func (k *Keyring) DeriveKey(purpose string) []byte {
	key, err := hkdf.Key(sha256.New, k.material, nil, "shoal derived key: "+purpose, 32)
	if err != nil {
		panic(err) // only for lengths HKDF-SHA256 cannot produce; 32 always works
	}
	return key
}

// NewKeyring returns a keyring that seals with current and opens tokens
// sealed with current or any previous key. Every key must be at least
// MinKeyLen bytes of secret material; the AES-256 key is derived from it
// with HKDF-SHA256.
func NewKeyring(current []byte, previous ...[]byte) (*Keyring, error) {
	aead := func(material []byte, what string) (cipher.AEAD, error) {
		if len(material) < MinKeyLen {
			return nil, fmt.Errorf("%w: %s of %d bytes, need %d", ErrKeyTooShort, what, len(material), MinKeyLen)
		}
		key, err := hkdf.Key(sha256.New, material, nil, hkdfInfo, 32)
		if err != nil {
			return nil, fmt.Errorf("derive binding key: %w", err)
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		return cipher.NewGCMWithRandomNonce(block)
	}
	cur, err := aead(current, "key")
	if err != nil {
		return nil, err
	}
	k := &Keyring{current: cur, material: append([]byte(nil), current...)}
	for _, p := range previous {
		a, err := aead(p, "previous key")
		if err != nil {
			return nil, err
		}
		k.previous = append(k.previous, a)
	}
	return k, nil
}

// Sign returns the token for c, sealed with the current key. (The name is
// kept from the first version, whose tokens were only signed.)
func (k *Keyring) Sign(c Claims) (string, error) {
	if err := c.validate(); err != nil {
		return "", err
	}
	body, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode binding claims: %w", err)
	}
	sealed := k.current.Seal(nil, nil, body, []byte(version))
	return prefix + base64.RawURLEncoding.EncodeToString(sealed), nil
}

// Verify opens the token with every key in the ring, checks its expiry
// against now and returns its claims. It does not check the claims against
// any object (the object host's job) nor the minting API token (the
// edge's).
func (k *Keyring) Verify(token string, now time.Time) (Claims, error) {
	if len(token) > MaxTokenLen {
		return Claims{}, fmt.Errorf("%w: %d bytes", ErrMalformed, len(token))
	}
	enc, ok := strings.CutPrefix(token, prefix)
	if !ok {
		return Claims{}, ErrMalformed
	}
	sealed, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || len(sealed) < k.current.Overhead() {
		return Claims{}, ErrMalformed
	}
	body, err := k.current.Open(nil, nil, sealed, []byte(version))
	for _, p := range k.previous {
		if err == nil {
			break
		}
		body, err = p.Open(nil, nil, sealed, []byte(version))
	}
	if err != nil {
		return Claims{}, ErrBadSignature
	}
	// Only decode claims once authentication proved the edge wrote them.
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

// MinSecretLen is the shortest configured secret KeyringFromSecrets accepts.
const MinSecretLen = 16

// KeyringFromSecrets builds a keyring from configured secrets (cluster.hcl's
// secrets.binding_key, flags): each secret's key material is
// SHA-256("shoal-binding-v1\x00" + secret), so any secret of at least
// MinSecretLen bytes yields full-size material for NewKeyring. Every edge and
// object host must build its keyring this way from the same secrets.
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
