package fsm

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBadInputRefusedWithClearErrors(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	before := dumpCatalog(t, f)

	envelope := func(v int, typ, rid string, ts int64, body string) []byte {
		c := Command{Version: v, Type: CommandType(typ), RequestID: rid, Time: ts}
		if body != "" {
			c.Body = json.RawMessage(body)
		}
		b, err := json.Marshal(c)
		require.NoError(t, err)
		return b
	}
	good := `{"uuid":"00000000-0000-4000-8000-000000000002","account_id":"a1","name":"x","object_id":"o","host_id":"h1"}`
	cases := []struct {
		name string
		data []byte
		want error
		code string
		msg  string
	}{
		{"malformed json", []byte(`{"v":1,"type":`), ErrInvalid, CodeInvalid, "malformed"},
		{"not json", []byte("\x00\xff garbage"), ErrInvalid, CodeInvalid, "malformed"},
		{"empty", nil, ErrInvalid, CodeInvalid, "malformed"},
		{"future version", envelope(CommandVersion+1, "create_database", "r", baseTime, good), ErrUnsupportedVersion, CodeUnsupportedVersion, "version 2"},
		{"version zero", envelope(0, "create_database", "r", baseTime, good), ErrInvalid, CodeInvalid, "version 0"},
		{"unknown type", envelope(1, "drop_everything", "r", baseTime, good), ErrUnknownCommand, CodeUnknownCommand, "drop_everything"},
		{"empty request id", envelope(1, "create_database", "", baseTime, good), ErrInvalid, CodeInvalid, "request id is empty"},
		{"oversized request id", envelope(1, "create_database", strings.Repeat("r", 65), baseTime, good), ErrInvalid, CodeInvalid, "request id is 65 bytes"},
		{"zero time", envelope(1, "create_database", "r", 0, good), ErrInvalid, CodeInvalid, "command time"},
		{"missing body", envelope(1, "create_database", "r1", baseTime, ""), ErrInvalid, CodeInvalid, "missing body"},
		{"body wrong type", envelope(1, "create_database", "r2", baseTime, `[1,2]`), ErrInvalid, CodeInvalid, "create_database body"},
		{"oversized name", encode(t, CmdCreateDatabase, "r3", baseTime, createDB(uuidN(2), "a1", strings.Repeat("n", 65))), ErrInvalid, CodeInvalid, "1..64 bytes"},
		{"uppercase name", encode(t, CmdCreateDatabase, "r4", baseTime, createDB(uuidN(2), "a1", "Shop")), ErrInvalid, CodeInvalid, "lowercase"},
		{"name with space", encode(t, CmdCreateDatabase, "r5", baseTime, createDB(uuidN(2), "a1", "my db")), ErrInvalid, CodeInvalid, "lowercase"},
		{"uppercase uuid", encode(t, CmdCreateDatabase, "r6", baseTime, createDB("ABCDEF00-0000-4000-8000-000000000002", "a1", "x")), ErrInvalid, CodeInvalid, "uuid"},
		{"braced uuid", encode(t, CmdCreateDatabase, "r7", baseTime, createDB("{"+uuidN(2)+"}", "a1", "x")), ErrInvalid, CodeInvalid, "uuid"},
		{"uuid without dashes", encode(t, CmdCreateDatabase, "r8", baseTime, createDB(strings.ReplaceAll(uuidN(2), "-", "")+"xxxx", "a1", "x")), ErrInvalid, CodeInvalid, "uuid"},
		{"oversized account id", encode(t, CmdCreateDatabase, "r9", baseTime, createDB(uuidN(2), strings.Repeat("a", 65), "x")), ErrInvalid, CodeInvalid, "account id is 65 bytes"},
		{"oversized region", encode(t, CmdCreateDatabase, "r10", baseTime, func() CreateDatabase {
			c := createDB(uuidN(2), "a1", "x")
			c.Region = strings.Repeat("r", 100)
			return c
		}()), ErrInvalid, CodeInvalid, "region is 100 bytes"},
		{"control character", encode(t, CmdCreateAccount, "r11", baseTime, CreateAccount{ID: "a\x00b", Name: "x", Tier: TierFree}), ErrInvalid, CodeInvalid, "control character"},
		{"negative limit", encode(t, CmdCreateAccount, "r12", baseTime, CreateAccount{ID: "a9", Name: "x", Tier: TierFree, Limits: Limits{MaxDatabases: -1}}), ErrInvalid, CodeInvalid, "negative limit"},
		{"bad host state", encode(t, CmdRegisterHost, "r13", baseTime, RegisterHost{ID: "h", Address: "x:1", State: "on fire"}), ErrInvalid, CodeInvalid, "host state"},
		{"too many stats", encode(t, CmdSetDatabaseStats, "r14", baseTime, SetDatabaseStats{Stats: make([]DatabaseStat, MaxStatsPerCommand+1)}), ErrInvalid, CodeInvalid, "at most"},
		{"negative seq", encode(t, CmdSetDatabaseStats, "r15", baseTime, SetDatabaseStats{Stats: []DatabaseStat{
			{UUID: uuidN(1), SizeBytes: 5, Seq: 1}, {UUID: uuidN(1), SizeBytes: 6, Seq: -1}}}), ErrInvalid, CodeInvalid, "seq -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := d.raw(tc.data)
			require.NotNil(t, r.Err)
			assert.ErrorIs(t, r.Err, tc.want)
			assert.Equal(t, tc.code, r.Err.Code)
			assert.Contains(t, r.Err.Message, tc.msg)
			assert.Equal(t, d.index, r.Index)
			assert.Empty(t, r.Value)
			assert.Equal(t, before, dumpCatalog(t, f))
		})
	}
	assert.Equal(t, d.index, f.AppliedIndex(), "refused entries are applied (as refusals)")
}
