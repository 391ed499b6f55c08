package fsm

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wantCreateCommand is what the client sent before the fast encoder:
// json.Marshal of NewCommand's command with the audit set.
func wantCreateCommand(t testing.TB, rid string, ts int64, body CreateDatabase, audit *Audit) []byte {
	cmd, err := NewCommand(CmdCreateDatabase, rid, ts, body)
	require.NoError(t, err)
	cmd.Audit = audit
	b, err := json.Marshal(cmd)
	require.NoError(t, err)
	return b
}

func TestEncodeCreateDatabaseCommandMatchesJSON(t *testing.T) {
	base := createDB(uuidN(7), "acct-1", "my-db")
	for i, tc := range []struct {
		rid   string
		ts    int64
		body  func(b *CreateDatabase)
		audit *Audit
		fast  bool
	}{
		{"0190-rid", 1_780_000_000_000_000_001, func(*CreateDatabase) {}, nil, true},
		{"r", -9223372036854775808, func(b *CreateDatabase) { b.Jurisdiction, b.ReadReplication = "eu", "auto" }, &Audit{Actor: "token:abc"}, true},
		{"r", 0, func(b *CreateDatabase) { *b = CreateDatabase{} }, &Audit{Actor: "token:abc", Source: "127.0.0.1:5555"}, true},
		{"", 9223372036854775807, func(*CreateDatabase) {}, &Audit{}, true},
		{"r", 1, func(b *CreateDatabase) { b.Name = `a"b` }, nil, false},
		{"r", 1, func(b *CreateDatabase) { b.Region = "<x>" }, nil, false},
		{"r", 1, func(b *CreateDatabase) { b.HostID = "é" }, nil, false},
		{"r\\", 1, func(*CreateDatabase) {}, nil, false},
		{"r", 1, func(*CreateDatabase) {}, &Audit{Actor: "a&b"}, false},
		{"r", 1, func(*CreateDatabase) {}, &Audit{Actor: "a", Source: "\x01"}, false},
	} {
		body := base
		tc.body(&body)
		got, ok := EncodeCreateDatabaseCommand(tc.rid, tc.ts, body, tc.audit)
		require.Equal(t, tc.fast, ok, "case %d", i)
		if ok {
			assert.Equal(t, string(wantCreateCommand(t, tc.rid, tc.ts, body, tc.audit)), string(got), "case %d", i)
		}
	}
}

func FuzzEncodeCreateDatabaseCommand(f *testing.F) {
	f.Add("rid", int64(1), "u", "a", "n", "actor", "src")
	f.Fuzz(func(t *testing.T, rid string, ts int64, s1, s2, s3, actor, source string) {
		body := CreateDatabase{UUID: s1, AccountID: s2, Name: s3, ObjectID: s1 + s3, HostID: s2, Region: s3, ReadReplication: s1}
		for _, audit := range []*Audit{nil, {Actor: actor, Source: source}} {
			got, ok := EncodeCreateDatabaseCommand(rid, ts, body, audit)
			if ok {
				require.Equal(t, string(wantCreateCommand(t, rid, ts, body, audit)), string(got))
			}
		}
	})
}

// checkDecodeDatabase: whatever DecodeDatabase accepts, json.Unmarshal
// decodes to the same Database. It reports whether the fast path took it.
func checkDecodeDatabase(t *testing.T, data []byte) bool {
	t.Helper()
	got, ok := DecodeDatabase(data)
	if !ok {
		return false
	}
	var want Database
	require.NoError(t, json.Unmarshal(data, &want), "accepted what encoding/json refuses: %q", data)
	require.Equal(t, want, got, "%q", data)
	return true
}

func TestDecodeDatabaseMatchesJSON(t *testing.T) {
	base := Database{UUID: uuidN(9), AccountID: "acct", Name: "db-9", ObjectID: "obj", HostID: "h1",
		HostAddress: "10.0.0.1:8080", Region: "weur", ReadReplication: ReadReplicationDisabled, State: StateActive,
		CreatedAt: 1_780_000_000_000_000_001, RoutingGeneration: 1}
	for i, v := range []func(d *Database){
		func(*Database) {},
		func(d *Database) { d.DeletedAt, d.State, d.RoutingGeneration, d.SizeBytes = 5, StateDeleted, 2, 1<<40 },
		func(d *Database) { d.SizeBytes, d.CreatedAt = -1, -9223372036854775807 },
		func(d *Database) { d.Jurisdiction, d.ReadReplication = "eu", "auto" },
		func(d *Database) { *d = Database{} },
	} {
		d := base
		v(&d)
		enc, err := encodeDatabase(d)
		require.NoError(t, err)
		require.True(t, checkDecodeDatabase(t, enc), "variant %d: the FSM's own encoding must take the fast path", i)
	}
	accepted := []string{`{}`, `{"size_bytes":3,"uuid":"u"}`, `{"created_at":-0}`}
	for _, s := range accepted {
		require.True(t, checkDecodeDatabase(t, []byte(s)), "should take the fast path: %s", s)
	}
	declined := []string{
		``, `null`, `[]`, `{"uuid":"u"} `, `{ "uuid":"u"}`, `{"UUID":"u"}`, `{"uuid":"u","uuid":"v"}`,
		`{"extra":1}`, `{"name":"a\"b"}`, `{"name":"\u0041"}`, `{"name":"é"}`, `{"created_at":1.5}`,
		`{"created_at":1e3}`, `{"created_at":01}`, `{"created_at":"1"}`, `{"name":null}`,
		`{"created_at":9223372036854775808}`, `{"uuid":"u"`, `{"uuid":"u",}`,
	}
	for _, s := range declined {
		_, ok := DecodeDatabase([]byte(s))
		assert.False(t, ok, "should decline: %s", s)
	}
}

func FuzzDecodeDatabase(f *testing.F) {
	f.Add([]byte(`{"uuid":"u","account_id":"a","name":"n","object_id":"o","host_id":"h","host_address":"x:1","region":"r","jurisdiction":"","read_replication":"disabled","state":"active","created_at":1,"routing_generation":1,"size_bytes":0}`))
	f.Add([]byte(`{"deleted_at":-5}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecodeDatabase(t, data)
	})
}
