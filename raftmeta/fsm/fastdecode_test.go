package fsm

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// slowDecode is the reference: what applyOne does without the fast path.
func slowDecode(data []byte) (Command, CreateDatabase, error) {
	var c Command
	if err := json.Unmarshal(data, &c); err != nil {
		return c, CreateDatabase{}, err
	}
	var b CreateDatabase
	if err := decodeBody(&c, &b); err != nil {
		return c, b, err
	}
	return c, b, nil
}

// checkFastMatchesSlow: whenever the fast path accepts, encoding/json
// accepts too and yields the same command and body.
func checkFastMatchesSlow(t *testing.T, data []byte) bool {
	t.Helper()
	fc, fb, ok := decodeCreateFast(data)
	if !ok {
		return false
	}
	sc, sb, err := slowDecode(data)
	require.NoError(t, err, "fast path accepted what encoding/json refuses: %s", data)
	require.Equal(t, sc.Type, CmdCreateDatabase)
	require.Equal(t, sc.Version, fc.Version, "%s", data)
	require.Equal(t, sc.Type, fc.Type, "%s", data)
	require.Equal(t, sc.RequestID, fc.RequestID, "%s", data)
	require.Equal(t, sc.Time, fc.Time, "%s", data)
	require.Equal(t, string(sc.Body), string(fc.Body), "%s", data)
	require.Equal(t, sb, fb, "%s", data)
	return true
}

func TestDecodeCreateFastMatchesJSON(t *testing.T) {
	canonical, err := json.Marshal(Command{Version: 1, Type: CmdCreateDatabase, RequestID: "r-1", Time: 1_780_000_000_000_000_001,
		Body: mustJSON(createDB(uuidN(1), "acct", "db-1"))})
	require.NoError(t, err)
	require.True(t, checkFastMatchesSlow(t, canonical), "canonical form must take the fast path")

	accepted := []string{
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{}}`,
		`{"body":{"name":"n","uuid":"u"},"ts":-5,"rid":"","type":"create_database","v":0}`,
		`{"v":-3,"type":"create_database","rid":"a<b>&c","ts":0,"body":{"region":"x y","read_replication":"auto"}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":9223372036854775807,"body":{}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":-9223372036854775807,"body":{}}`,
	}
	for _, s := range accepted {
		require.True(t, checkFastMatchesSlow(t, []byte(s)), "should take the fast path: %s", s)
	}
	declined := []string{
		``, `{}`, `null`, `[]`,
		`{"v":1,"type":"delete_database","rid":"x","ts":1,"body":{"uuid":"u","account_id":"a"}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":null}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{}} `,
		`{ "v":1,"type":"create_database","rid":"x","ts":1,"body":{}}`,
		`{"v":1,"Type":"create_database","rid":"x","ts":1,"body":{}}`,
		`{"v":1,"type":"create_database","type":"create_database","rid":"x","ts":1,"body":{}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{},"body":{}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{"name":"a","name":"b"}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{"Name":"a"}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{"extra":"a"}}`,
		`{"v":1,"type":"create_database","rid":"x\u0041","ts":1,"body":{}}`,
		`{"v":1,"type":"create_database","rid":"é","ts":1,"body":{}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1.0,"body":{}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1e3,"body":{}}`,
		`{"v":01,"type":"create_database","rid":"x","ts":1,"body":{}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":9223372036854775808,"body":{}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":12345678901234567890,"body":{}}`,
		`{"v":1234567890,"type":"create_database","rid":"x","ts":1,"body":{}}`,
		`{"v":"1","type":"create_database","rid":"x","ts":1,"body":{}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{"name":5}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{"name":null}}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{}`,
		`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{}}}`,
		`{"v":-,"type":"create_database","rid":"x","ts":1,"body":{}}`,
	}
	for _, s := range declined {
		_, _, ok := decodeCreateFast([]byte(s))
		require.False(t, ok, "should fall back to encoding/json: %s", s)
	}
}

// FuzzDecodeCreateFast: on any input, the fast path either declines or
// agrees with encoding/json.
func FuzzDecodeCreateFast(f *testing.F) {
	f.Add([]byte(`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{"uuid":"00000000-0000-4000-8000-000000000001","account_id":"a0","name":"n","object_id":"o","host_id":"h"}}`))
	f.Add([]byte(`{"v":1,"type":"create_database","rid":"x","ts":-1,"body":{}}`))
	f.Add([]byte(`{"body":{"read_replication":"auto"},"v":0,"type":"create_database","rid":"","ts":0}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFastMatchesSlow(t, data)
	})
}

func TestEncodeDatabaseMatchesJSON(t *testing.T) {
	base := Database{UUID: uuidN(9), AccountID: "acct", Name: "db-9", ObjectID: "obj", HostID: "h1",
		HostAddress: "10.0.0.1:8080", Region: "weur", ReadReplication: ReadReplicationDisabled, State: StateActive,
		CreatedAt: 1_780_000_000_000_000_001, RoutingGeneration: 1}
	variants := []func(d *Database){
		func(*Database) {},
		func(d *Database) { d.DeletedAt, d.State, d.RoutingGeneration = 5, StateDeleted, 2 },
		func(d *Database) { d.SizeBytes, d.CreatedAt = -1, -9223372036854775808 },
		func(d *Database) { d.Name = `a"b` },
		func(d *Database) { d.Region = `a\b` },
		func(d *Database) { d.HostAddress = "<x>&" },
		func(d *Database) { d.Jurisdiction = "é" },
		func(d *Database) { d.ObjectID = "\x01\u2028" },
		func(d *Database) { *d = Database{} },
	}
	for i, v := range variants {
		d := base
		v(&d)
		want, err := json.Marshal(d)
		require.NoError(t, err)
		got, err := encodeDatabase(d)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "variant %d", i)
	}
}

func FuzzEncodeDatabase(f *testing.F) {
	f.Add("u", "a", "n", "<", int64(1), int64(0))
	f.Fuzz(func(t *testing.T, s1, s2, s3, s4 string, i1, i2 int64) {
		d := Database{UUID: s1, AccountID: s2, Name: s3, HostAddress: s4, Region: s1 + s4, CreatedAt: i1, DeletedAt: i2, SizeBytes: i1 ^ i2}
		want, err := json.Marshal(d)
		require.NoError(t, err)
		got, err := encodeDatabase(d)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
	})
}

// checkStatsFastMatchesSlow: whenever the stats fast path accepts,
// encoding/json accepts too and yields the same command and body.
func checkStatsFastMatchesSlow(t *testing.T, data []byte) bool {
	t.Helper()
	fc, fb, ok := decodeStatsFast(data)
	if !ok {
		return false
	}
	var sc Command
	require.NoError(t, json.Unmarshal(data, &sc), "fast path accepted what encoding/json refuses: %s", data)
	var sb SetDatabaseStats
	require.NoError(t, decodeBody(&sc, &sb), "fast path accepted a body encoding/json refuses: %s", data)
	require.Equal(t, CmdSetDatabaseStats, sc.Type)
	require.Equal(t, sc.Version, fc.Version, "%s", data)
	require.Equal(t, sc.Type, fc.Type, "%s", data)
	require.Equal(t, sc.RequestID, fc.RequestID, "%s", data)
	require.Equal(t, sc.Time, fc.Time, "%s", data)
	require.Equal(t, string(sc.Body), string(fc.Body), "%s", data)
	require.Equal(t, len(sb.Stats), len(fb.Stats), "%s", data)
	for i := range sb.Stats {
		require.Equal(t, sb.Stats[i], fb.Stats[i], "%s", data)
	}
	return true
}

func TestDecodeStatsFastMatchesJSON(t *testing.T) {
	canonical, err := json.Marshal(Command{Version: 1, Type: CmdSetDatabaseStats, RequestID: "r-1", Time: 1_780_000_000_000_000_001,
		Body: mustJSON(SetDatabaseStats{Stats: []DatabaseStat{{UUID: uuidN(1), SizeBytes: 4096, Seq: 1_780_000_000_000_000_002},
			{UUID: uuidN(2)}, {UUID: uuidN(3), SizeBytes: MaxDatabaseSizeBytes, Seq: -1}}})})
	require.NoError(t, err)
	require.True(t, checkStatsFastMatchesSlow(t, canonical), "canonical form must take the fast path")

	accepted := []string{
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{}}`,
		`{"body":{"stats":[{"seq":3,"uuid":"u"},{}]},"ts":-5,"rid":"","type":"set_database_stats","v":0}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{"uuid":"a<b>&","size_bytes":-9223372036854775807,"seq":9223372036854775807}]}}`,
	}
	for _, s := range accepted {
		require.True(t, checkStatsFastMatchesSlow(t, []byte(s)), "should take the fast path: %s", s)
	}
	declined := []string{
		``, `{}`, `null`,
		`{"v":1,"type":"drain_stats","rid":"x","ts":1,"body":{"stats":[]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":null}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":null}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[null]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[],"stats":[]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"Stats":[]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{"UUID":"u"}]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{"uuid":"u","uuid":"v"}]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{"uuid":"u","extra":1}]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{"size_bytes":1.5}]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{"seq":1e3}]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{"seq":9223372036854775808}]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{"uuid":"\u0041"}]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{}, {}]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{},]}}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{}]}`,
		`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":{}}}`,
	}
	for _, s := range declined {
		_, _, ok := decodeStatsFast([]byte(s))
		require.False(t, ok, "should fall back to encoding/json: %s", s)
	}
	// Each fast path declines the other's entries.
	_, _, ok := decodeCreateFast(canonical)
	require.False(t, ok)
	create, err := json.Marshal(Command{Version: 1, Type: CmdCreateDatabase, RequestID: "r", Time: 1, Body: mustJSON(createDB(uuidN(1), "a", "n"))})
	require.NoError(t, err)
	_, _, ok = decodeStatsFast(create)
	require.False(t, ok)
}

// FuzzDecodeStatsFast: on any input, the stats fast path either declines
// or agrees with encoding/json.
func FuzzDecodeStatsFast(f *testing.F) {
	f.Add([]byte(`{"v":1,"type":"set_database_stats","rid":"x","ts":1,"body":{"stats":[{"uuid":"00000000-0000-4000-8000-000000000001","size_bytes":4096,"seq":7}]}}`))
	f.Add([]byte(`{"v":1,"type":"set_database_stats","rid":"x","ts":-1,"body":{"stats":[]}}`))
	f.Add([]byte(`{"body":{"stats":[{},{"seq":-2}]},"v":0,"type":"set_database_stats","rid":"","ts":0}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkStatsFastMatchesSlow(t, data)
	})
}
