package fsm

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The audit detail's direct encoding is json.Marshal's, byte for byte: for
// the details the commands write (a create's, with plain strings) and for
// anything that takes the fallback (escapes, HTML characters, non-ASCII,
// values that are not strings).
func TestEncodeAuditDetailMatchesJSON(t *testing.T) {
	cases := []map[string]any{
		{"name": "db-1", "host": "h1", "jurisdiction": ""},
		{"name": `quote " and \ back`, "host": "h1"},
		{"name": "<script>&", "host": "h\u2028"},
		{"name": "ünïcode", "z": "a", "a": "z"},
		{"name": "x", "tier": TierPaid, "n": json.Number("5"), "limits": Limits{MaxDatabases: 3}},
		{"admin": true, "expires_at": int64(7), "databases": []string{"a"}},
		{"k\n": "v"},
		{"only": ""},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcXYZ019 -_.:/\"\\<>&\t\u00e9\u2028")
	str := func() string {
		r := make([]rune, rng.IntN(12))
		for i := range r {
			r[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(r)
	}
	for range 2000 {
		m := map[string]any{}
		for range 1 + rng.IntN(5) {
			m[str()] = str()
		}
		cases = append(cases, m)
	}
	for _, m := range cases {
		want, err := json.Marshal(m)
		require.NoError(t, err)
		got, err := encodeAuditDetail(m)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), "%#v", m)
	}
}

// BenchmarkEncodeAuditDetail: a create's audit detail, directly and
// through encoding/json (the code before).
//
//	go test ./raftmeta/fsm -run XXX -bench EncodeAuditDetail
func BenchmarkEncodeAuditDetail(b *testing.B) {
	m := map[string]any{"name": "raw-123456", "host": "h1", "jurisdiction": ""}
	b.Run("direct", func(b *testing.B) {
		for range b.N {
			if _, err := encodeAuditDetail(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for range b.N {
			if _, err := json.Marshal(m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
