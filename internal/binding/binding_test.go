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
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	k, err := NewKeyring(key1)
	require.NoError(t, err)
	tok, err := k.Sign(claims())
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(tok, "v1."))
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
	parts := strings.Split(tok, ".")
	other := claims()
	other.AccountID = "acct2"
	k2, _ := NewKeyring(key2)
	otherTok, _ := k2.Sign(other)
	// Splice another token's claims with this token's signature.
	forged := parts[0] + "." + strings.Split(otherTok, ".")[1] + "." + parts[2]
	_, err = k.Verify(forged, t0)
	assert.ErrorIs(t, err, ErrBadSignature)
}

func TestVerifyMalformed(t *testing.T) {
	k, _ := NewKeyring(key1)
	for _, tok := range []string{
		"", "v1", "v1.a", "v2.a.b", "v1.a.b.c",
		"v1.!!!." + base64.RawURLEncoding.EncodeToString(make([]byte, 32)),
		"v1.e30.short",
		strings.Repeat("a", MaxTokenLen+1),
	} {
		_, err := k.Verify(tok, t0)
		assert.Error(t, err, "token %q", tok)
	}
	// A validly signed token with empty claims is still refused.
	signed := "v1." + base64.RawURLEncoding.EncodeToString([]byte(`{}`))
	tok := signed + "." + base64.RawURLEncoding.EncodeToString(mac(key1, signed))
	_, err := k.Verify(tok, t0)
	assert.ErrorIs(t, err, ErrInvalidClaim)
}

func TestSignRejectsIncompleteClaims(t *testing.T) {
	k, _ := NewKeyring(key1)
	c := claims()
	c.HostAddress = ""
	_, err := k.Sign(c)
	assert.ErrorIs(t, err, ErrInvalidClaim)
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
	SetHeader(h, "v1.x.y")
	tok, err := FromHeader(h)
	require.NoError(t, err)
	assert.Equal(t, "v1.x.y", tok)
	h.Set("Authorization", "binding  v1.x.y ")
	tok, err = FromHeader(h)
	require.NoError(t, err)
	assert.Equal(t, "v1.x.y", tok)
	h.Set("Authorization", "Bearer v1.x.y")
	_, err = FromHeader(h)
	assert.ErrorIs(t, err, ErrNoToken)
}

func FuzzVerify(f *testing.F) {
	k, _ := NewKeyring(key1)
	tok, _ := k.Sign(claims())
	f.Add(tok)
	f.Add("v1..")
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
