package chsink

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/pipeline/event"
)

// sameAsStdlib checks decodeUsage against json.Unmarshal on one input:
// both fail, or both succeed with the same value.
func sameAsStdlib(t testing.TB, b []byte) {
	var want, got event.Usage
	werr := json.Unmarshal(b, &want)
	gerr := decodeUsage(b, &got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("input %q: encoding/json err=%v, decodeUsage err=%v", b, werr, gerr)
	}
	if werr == nil && want != got {
		t.Fatalf("input %q:\nencoding/json %+v\ndecodeUsage   %+v", b, want, got)
	}
}

func randomUsage(rng *rand.Rand) event.Usage {
	strs := []string{"", "a", "acct-42", "héllo", `quo"te`, `back\slash`, "tab\t", "\u2028", "SELECT * FROM t WHERE x = ?", "\xff\xfe"}
	ints := []int64{0, 1, -1, 42, math.MaxInt64, math.MinInt64, 1 << 53, -(1 << 53)}
	pickS := func() string { return strs[rng.IntN(len(strs))] }
	pickI := func() int64 {
		if rng.IntN(2) == 0 {
			return ints[rng.IntN(len(ints))]
		}
		return rng.Int64()
	}
	return event.Usage{
		V: int(pickI() % 4), EventID: event.ID{Producer: pickS(), Seq: rng.Uint64()},
		Host: pickS(), AccountID: pickS(), DatabaseUUID: pickS(), Shape: pickS(), ShapeHash: rng.Uint64(),
		WindowStart: pickI(), WindowEnd: pickI(), Queries: pickI(), Errors: pickI(),
		RowsRead: pickI(), RowsWritten: pickI(), DurationUs: pickI(), MaxDuration: pickI(),
	}
}

func TestDecodeUsageMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for i := 0; i < 20_000; i++ {
		u := randomUsage(rng)
		b, err := event.Encode(u)
		require.NoError(t, err)
		sameAsStdlib(t, b)
		var got event.Usage
		require.NoError(t, decodeUsage(b, &got))
		if utf8.ValidString(u.EventID.Producer) { // encoding/json replaces invalid UTF-8
			require.Equal(t, u.EventID, got.EventID)
		}

		// Mutations: a byte changed, removed or inserted; whitespace;
		// an unknown or re-cased key; truncation.
		m := append([]byte(nil), b...)
		switch rng.IntN(7) {
		case 0:
			m[rng.IntN(len(m))] = "{}[]:,\" -0123456789.eEnulltrfase\\x"[rng.IntN(34)]
		case 1:
			j := rng.IntN(len(m))
			m = append(m[:j], m[j+1:]...)
		case 2:
			j := rng.IntN(len(m))
			m = append(m[:j], append([]byte{"{}:,\"0 "[rng.IntN(7)]}, m[j:]...)...)
		case 3:
			m = []byte(strings.ReplaceAll(string(m), ",", " ,\n\t"))
		case 4:
			m = []byte(strings.Replace(string(m), `"host"`, `"Host"`, 1))
		case 5:
			m = []byte(strings.Replace(string(m), `{"v"`, `{"extra":[1,{"a":null}],"v"`, 1))
		case 6:
			m = m[:rng.IntN(len(m))]
		}
		sameAsStdlib(t, m)
	}
	for _, s := range []string{
		``, `{}`, `null`, `[]`, `{"v":1}`, `{"v":1.0}`, `{"v":1e0}`, `{"v":01}`, `{"v":-0}`, `{"v":null}`,
		`{"queries":9223372036854775807}`, `{"queries":9223372036854775808}`, `{"queries":-9223372036854775808}`,
		`{"queries":-9223372036854775809}`, `{"shape_hash":18446744073709551615}`, `{"shape_hash":18446744073709551616}`,
		`{"shape_hash":-1}`, `{"v":1,"v":2}`, `{"event_id":{"seq":1,"seq":2}}`, `{"event_id":null}`, `{"event_id":{}}`,
		`{"host":"a"} x`, ` {"host" : "a" } `, `{"host":"a",}`, `{,"host":"a"}`, `{"host":"a""b"}`, `{"host":1}`,
		`{"queries":"1"}`, `{"V":1}`, `{"account_id":"\u0041"}`,
	} {
		sameAsStdlib(t, []byte(s))
	}
}

func FuzzDecodeUsage(f *testing.F) {
	rng := rand.New(rand.NewPCG(10, 10))
	for i := 0; i < 20; i++ {
		b, _ := event.Encode(randomUsage(rng))
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"event_id":{"producer":"p","seq":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) { sameAsStdlib(t, b) })
}

func BenchmarkDecodeUsage(b *testing.B) {
	u := event.Usage{V: 1, EventID: event.ID{Producer: "host-1/1764576000", Seq: 123456789}, Host: "host-1",
		AccountID: "acct-12345", DatabaseUUID: "0193a7c2-5b1e-7c4d-9e2f-000000012345",
		Shape: "SELECT id, name, email FROM users_3 WHERE id = ? AND tenant = ?", ShapeHash: 0x9e3779b97f4a7c15,
		WindowStart: 1764576000000, WindowEnd: 1764576001000, Queries: 12, Errors: 0, RowsRead: 1200,
		RowsWritten: 24, DurationUs: 5400, MaxDuration: 870}
	rec, _ := event.Encode(u)
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(len(rec)))
		for b.Loop() {
			var v event.Usage
			if err := decodeUsage(rec, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(rec)))
		for b.Loop() {
			var v event.Usage
			if err := json.Unmarshal(rec, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
