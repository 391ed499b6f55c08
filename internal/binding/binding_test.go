package binding

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	key1 = bytes.Repeat([]byte{1}, 32)
	key2 = bytes.Repeat([]byte{2}, 32)
	t0   = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
)

func claims() Claims {
	return Claims{
		DatabaseUUID: "7b0c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3",
		ObjectID:     "0123456789abcdef0123456789abcdef",
		AccountID:    "acct1",
		HostAddress:  "127.0.0.1:7001",
		Generation:   3,
		IssuedAt:     t0.Unix(),
		ExpiresAt:    t0.Add(time.Hour).Unix(),
		TokenID:      "00112233445566778899aabbccddeeff",
		Epoch:        2,
		Parent:       strings.Repeat("ab", 32),
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	k, err := NewKeyring(key1)
	require.NoError(t, err)
	tok, err := k.Sign(claims())
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(tok, "v2."))
	got, err := k.Verify(tok, t0.Add(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, claims(), got)
}

func TestVerifyRejectsExpired(t *testing.T) {
	k, _ := NewKeyring(key1)
	tok, err := k.Sign(claims())
	require.NoError(t, err)
	_, err = k.Verify(tok, t0.Add(time.Hour)) // exactly at expiry: invalid
	assert.ErrorIs(t, err, ErrExpired)
	_, err = k.Verify(tok, t0.Add(time.Hour-time.Second))
	assert.NoError(t, err)
}

func TestVerifyRejectsOtherKey(t *testing.T) {
	k1, _ := NewKeyring(key1)
	k2, _ := NewKeyring(key2)
	tok, err := k1.Sign(claims())
	require.NoError(t, err)
	_, err = k2.Verify(tok, t0)
	assert.ErrorIs(t, err, ErrBadSignature)
}

func TestKeyRotation(t *testing.T) {
	old, _ := NewKeyring(key1)
	tok, err := old.Sign(claims())
	require.NoError(t, err)
	rotated, err := NewKeyring(key2, key1)
	require.NoError(t, err)
	_, err = rotated.Verify(tok, t0)
	assert.NoError(t, err, "a token signed with a previous key stays valid")
	newTok, err := rotated.Sign(claims())
	require.NoError(t, err)
	_, err = old.Verify(newTok, t0)
	assert.ErrorIs(t, err, ErrBadSignature, "new tokens are signed with the new key")
}

func TestVerifyRejectsTamperedClaims(t *testing.T) {
	k, _ := NewKeyring(key1)
	tok, err := k.Sign(claims())
	require.NoError(t, err)
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(tok, "v2."))
	require.NoError(t, err)
	// Flip each byte in turn (nonce, ciphertext, tag): none opens.
	for i := range raw {
		forged := bytes.Clone(raw)
		forged[i] ^= 0x01
		_, err = k.Verify("v2."+base64.RawURLEncoding.EncodeToString(forged), t0)
		require.ErrorIs(t, err, ErrBadSignature, "byte %d", i)
	}
	// Another token's body under this prefix, truncated or extended: refused.
	_, err = k.Verify(tok[:len(tok)-4], t0)
	assert.Error(t, err)
	_, err = k.Verify(tok+"AAAA", t0)
	assert.Error(t, err)
}

// The holder of a token cannot read its claims: neither the host address,
// the object ID, the account, the database nor the token ID appear in the
// token or its base64 decoding, and two tokens of the same claims differ.
func TestTokensAreOpaque(t *testing.T) {
	k, _ := NewKeyring(key1)
	c := claims()
	tok, err := k.Sign(c)
	require.NoError(t, err)
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(tok, "v2."))
	require.NoError(t, err)
	for _, secret := range []string{c.HostAddress, "127.0.0.1", c.ObjectID, c.AccountID, c.DatabaseUUID, c.TokenID, c.Parent, `"h"`} {
		assert.NotContains(t, tok, secret)
		assert.False(t, bytes.Contains(raw, []byte(secret)), "decoded token holds %q", secret)
	}
	again, err := k.Sign(c)
	require.NoError(t, err)
	assert.NotEqual(t, tok, again, "a fresh nonce per token")
}

func TestVerifyMalformed(t *testing.T) {
	k, _ := NewKeyring(key1)
	for _, tok := range []string{
		"", "v2", "v2.", "v2.a", "v2.!!!", "v1.a.b", "v3.abc",
		"v2." + base64.RawURLEncoding.EncodeToString(make([]byte, 27)),
		"v2." + base64.RawURLEncoding.EncodeToString(make([]byte, 64)),
		strings.Repeat("a", MaxTokenLen+1),
	} {
		_, err := k.Verify(tok, t0)
		assert.Error(t, err, "token %q", tok)
	}
	// A validly sealed token with empty claims is still refused.
	sealed := k.current.Seal(nil, nil, []byte(`{}`), []byte("v2"))
	_, err := k.Verify("v2."+base64.RawURLEncoding.EncodeToString(sealed), t0)
	assert.ErrorIs(t, err, ErrInvalidClaim)
}

// First-version tokens (HMAC-signed, readable claims) are refused: their
// claims name no token ID, epoch or parent, so they could not be revoked.
func TestV1TokensRefused(t *testing.T) {
	k, _ := NewKeyring(key1)
	v1 := "v1." + base64.RawURLEncoding.EncodeToString([]byte(`{"d":"x","o":"y","a":"z","h":"127.0.0.1:1","exp":9999999999}`)) + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 32))
	_, err := k.Verify(v1, t0)
	assert.ErrorIs(t, err, ErrMalformed)
}

func TestSignRejectsIncompleteClaims(t *testing.T) {
	k, _ := NewKeyring(key1)
	for _, mod := range []func(*Claims){
		func(c *Claims) { c.HostAddress = "" },
		func(c *Claims) { c.TokenID = "" },
		func(c *Claims) { c.TokenID = "not-hex" },
		func(c *Claims) { c.Parent = "" },
	} {
		c := claims()
		mod(&c)
		_, err := k.Sign(c)
		assert.ErrorIs(t, err, ErrInvalidClaim)
	}
	assert.True(t, ValidTokenID(NewTokenID()))
	assert.NotEqual(t, NewTokenID(), NewTokenID())
}

func TestKeyTooShort(t *testing.T) {
	_, err := NewKeyring([]byte("short"))
	assert.ErrorIs(t, err, ErrKeyTooShort)
	_, err = NewKeyring(key1, []byte("short"))
	assert.ErrorIs(t, err, ErrKeyTooShort)
}

func TestHeader(t *testing.T) {
	h := http.Header{}
	_, err := FromHeader(h)
	assert.ErrorIs(t, err, ErrNoToken)
	SetHeader(h, "v2.xy")
	tok, err := FromHeader(h)
	require.NoError(t, err)
	assert.Equal(t, "v2.xy", tok)
	h.Set("Authorization", "binding  v2.xy ")
	tok, err = FromHeader(h)
	require.NoError(t, err)
	assert.Equal(t, "v2.xy", tok)
	h.Set("Authorization", "Bearer v2.xy")
	_, err = FromHeader(h)
	assert.ErrorIs(t, err, ErrNoToken)
}

func FuzzVerify(f *testing.F) {
	k, _ := NewKeyring(key1)
	tok, _ := k.Sign(claims())
	f.Add(tok)
	f.Add("v2.")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := k.Verify(s, t0)
		if err == nil {
			// Anything that verifies must re-sign to a verifiable token with the same claims.
			again, err := k.Sign(c)
			require.NoError(t, err)
			c2, err := k.Verify(again, t0)
			require.NoError(t, err)
			assert.Equal(t, c, c2)
		}
	})
}

func TestKeyringFromSecrets(t *testing.T) {
	_, err := KeyringFromSecrets("short")
	assert.ErrorIs(t, err, ErrKeyTooShort)
	a, err := KeyringFromSecrets("a-configured-secret")
	require.NoError(t, err)
	b, err := KeyringFromSecrets("a-configured-secret")
	require.NoError(t, err)
	tok, err := a.Sign(claims())
	require.NoError(t, err)
	_, err = b.Verify(tok, t0)
	assert.NoError(t, err, "the same secret on two processes yields the same key")
	c, err := KeyringFromSecrets("another-configured-secret", "a-configured-secret")
	require.NoError(t, err)
	_, err = c.Verify(tok, t0)
	assert.NoError(t, err)
}
