package fsm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fillValue sets every field reachable from v (a pointer) to a non-zero
// value derived from seed, so a JSON round trip that loses a field (a
// missing or duplicate tag, an unexported field) shows.
func fillValue(t *testing.T, v reflect.Value, seed *int) {
	t.Helper()
	*seed++
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fillValue(t, v.Elem(), seed)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			require.True(t, v.Type().Field(i).IsExported(), "%s.%s: bodies travel as JSON, fields must be exported",
				v.Type(), v.Type().Field(i).Name)
			fillValue(t, v.Field(i), seed)
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := 0; i < s.Len(); i++ {
			fillValue(t, s.Index(i), seed)
		}
		v.Set(s)
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *seed))
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(*seed))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for i := 0; i < 2; i++ {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fillValue(t, k, seed)
			fillValue(t, e, seed)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	default:
		t.Fatalf("fillValue: add %s", v.Kind())
	}
}

func sortedTypes() []CommandType {
	var ts []CommandType
	for t := range commands {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// TestEveryCommandIsDefined: each registered command has validation and an
// apply, lists only known refusals, and its body survives the trip through
// the log (NewCommand, the entry's JSON, decodeBody) field for field.
func TestEveryCommandIsDefined(t *testing.T) {
	require.NotEmpty(t, commands)
	for _, typ := range sortedTypes() {
		spec := commands[typ]
		t.Run(string(typ), func(t *testing.T) {
			require.NoError(t, spec.complete())
			for _, r := range spec.refusals() {
				assert.True(t, IsRefusal(r), "%v is not in refusals (refusal.go)", r)
				assert.NotContains(t, envelopeRefusals, r, "envelope refusals are implied")
			}

			body := spec.newBody()
			if body == nil {
				assert.Equal(t, CmdNoop, typ, "only noop has no body")
				return
			}
			require.Equal(t, reflect.Pointer, reflect.TypeOf(body).Kind())
			seed := 0
			fillValue(t, reflect.ValueOf(body), &seed)
			cmd, err := NewCommand(typ, "rid-1", baseTime, reflect.ValueOf(body).Elem().Interface())
			require.NoError(t, err)
			entry, err := json.Marshal(cmd)
			require.NoError(t, err)
			var back Command
			require.NoError(t, json.Unmarshal(entry, &back))
			assert.Equal(t, cmd, back)
			got := spec.newBody()
			require.NoError(t, decodeBody(&back, got))
			assert.Equal(t, body, got, "body lost in the round trip: %s", back.Body)
			again, err := json.Marshal(got)
			require.NoError(t, err)
			assert.JSONEq(t, string(cmd.Body), string(again))
		})
	}
}

// TestEveryCommandHasItsFile keeps the layout DESIGN.md describes: command
// <type> is defined in cmd_<type>.go.
func TestEveryCommandHasItsFile(t *testing.T) {
	for typ := range commands {
		_, err := os.Stat("cmd_" + string(typ) + ".go")
		assert.NoError(t, err, "command %s", typ)
	}
}

// TestRegistryPreparesEveryCommand: an open catalog has every registered
// command bound to its statements.
func TestRegistryPreparesEveryCommand(t *testing.T) {
	f := newFSM(t)
	require.Len(t, f.stmts.cmds, len(commands))
	for typ := range commands {
		b, ok := f.stmts.cmds[typ]
		require.True(t, ok, typ)
		assert.NotNil(t, b.spec, typ)
	}
}

// TestRefusalsAreRecognised: every refusal, as a wrapped sentinel (in
// process) and as an *Error (after the wire), is a refusal with its code
// and matches its sentinel; nothing else is.
func TestRefusalsAreRecognised(t *testing.T) {
	seenCodes, seenErrs := map[string]bool{}, map[error]bool{}
	for _, r := range Refusals() {
		t.Run(r.Code, func(t *testing.T) {
			require.False(t, seenCodes[r.Code], "duplicate code")
			require.False(t, seenErrs[r.Err], "duplicate sentinel")
			seenCodes[r.Code], seenErrs[r.Err] = true, true

			wrapped := fmt.Errorf("%w: some detail", r.Err)
			wire := ToError(wrapped)
			assert.Equal(t, r.Code, wire.Code)
			assert.Equal(t, wrapped.Error(), wire.Message)
			var decoded *Error
			b, err := json.Marshal(wire)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &decoded))
			for _, e := range []error{r.Err, wrapped, wire, decoded, fmt.Errorf("outer: %w", decoded)} {
				assert.True(t, IsRefusal(e), "%#v", e)
				code, ok := RefusalCode(e)
				assert.True(t, ok)
				assert.Equal(t, r.Code, code)
				assert.ErrorIs(t, e, r.Err)
				for _, other := range refusals {
					if other.Err != r.Err {
						assert.NotErrorIs(t, e, other.Err, "%s matches %s", r.Code, other.Code)
					}
				}
			}
		})
	}
	for _, e := range envelopeRefusals {
		assert.True(t, IsRefusal(e), e)
	}
	for _, e := range []error{nil, errors.New("catalog down"), ErrClosed, ErrUnavailable, ErrInvalidSnapshot,
		&fatalError{errors.New("disk I/O error")}, &Error{Code: "from_a_newer_build", Message: "?"}} {
		assert.False(t, IsRefusal(e), "%v", e)
		_, ok := RefusalCode(e)
		assert.False(t, ok)
	}
}

// refusalCodesOf is the codes a command of type typ may be refused with.
func refusalCodesOf(typ CommandType) []string {
	errs := append([]error(nil), envelopeRefusals...)
	if spec, ok := commands[typ]; ok {
		errs = append(errs, spec.refusals()...)
	}
	var codes []string
	for _, e := range errs {
		code, _ := RefusalCode(e)
		codes = append(codes, code)
	}
	sort.Strings(codes)
	return codes
}

// TestApplyRefusesOnlyWithListedRefusals applies random logs full of
// collisions plus one case per listed refusal, and checks that every
// refusal Apply answers is a refusal its command lists (or an envelope
// one), so the lists callers rely on are true.
func TestApplyRefusesOnlyWithListedRefusals(t *testing.T) {
	seen := map[CommandType]map[string]bool{}
	check := func(t *testing.T, typ CommandType, r Result) {
		t.Helper()
		if r.Err == nil {
			return
		}
		assert.True(t, IsRefusal(r.Err), "index %d: %v is not a refusal", r.Index, r.Err)
		assert.Contains(t, refusalCodesOf(typ), r.Err.Code, "index %d (%s): refusal %v not listed", r.Index, typ, r.Err)
		if seen[typ] == nil {
			seen[typ] = map[string]bool{}
		}
		seen[typ][r.Err.Code] = true
	}
	for seed := uint64(1); seed <= 4; seed++ {
		f := newFSM(t, deterministicOpts()...)
		logs := randomLogs(t, seed, 1500)
		rids := map[string]bool{}
		for i, out := range f.ApplyBatch(logs) {
			r, ok := out.(Result)
			if !ok {
				continue
			}
			var c Command
			_ = json.Unmarshal(logs[i].Data, &c) // a malformed entry gets an envelope refusal
			if rids[c.RequestID] {
				continue // a retry is answered with the first entry's result, whatever its type
			}
			rids[c.RequestID] = true
			check(t, c.Type, r)
		}
	}

	// One case for each refusal a command lists.
	f := newFSM(t)
	d := newDriver(t, f)
	// The level-1 cluster's refusal of a level-2 command, then level 2.
	check(t, CmdDeleteDatabaseIf, d.do(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: uuidN(9), ExpectObjectID: "o1", ExpectRoutingGeneration: 1}))
	d.ok(CmdSetClusterLevel, SetClusterLevel{Level: 2})
	d.account("a1", 1)
	d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: HostStateActive})
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	hash := fmt.Sprintf("%064x", 1)
	d.ok(CmdCreateToken, CreateToken{ID: "t1", AccountID: "a1", Hash: hash, Name: "tok"})
	cases := []struct {
		typ  CommandType
		body any
		want error
	}{
		{CmdCreateAccount, CreateAccount{ID: "a1", Name: "again", Tier: TierFree, Limits: bigLimits()}, ErrExists},
		{CmdUpdateAccount, UpdateAccount{ID: "nope"}, ErrAccountNotFound},
		{CmdCreateToken, CreateToken{ID: "t2", AccountID: "nope", Hash: fmt.Sprintf("%064x", 2), Name: "x"}, ErrAccountNotFound},
		{CmdCreateToken, CreateToken{ID: "t1", AccountID: "a1", Hash: fmt.Sprintf("%064x", 2), Name: "x"}, ErrExists},
		{CmdCreateToken, CreateToken{ID: "t2", AccountID: "a1", Hash: hash, Name: "x"}, ErrExists},
		{CmdRevokeToken, RevokeToken{ID: "nope"}, ErrNotFound},
		{CmdReportHostLoad, ReportHostLoad{ID: "nope"}, ErrNotFound},
		{CmdCreateDatabase, createDB(uuidN(2), "nope", "two"), ErrAccountNotFound},
		{CmdCreateDatabase, createDB(uuidN(1), "a1", "two"), ErrExists},
		{CmdCreateDatabase, createDB(uuidN(2), "a1", "one"), ErrNameTaken},
		{CmdCreateDatabase, createDB(uuidN(2), "a1", "two"), ErrDatabaseLimit},
		{CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(9)}, ErrNotFound},
		{CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: uuidN(9), ExpectObjectID: "o1", ExpectRoutingGeneration: 1}, ErrNotFound},
		{CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: uuidN(1), ExpectObjectID: "o1", ExpectRoutingGeneration: 1}, ErrConflict},
		{CmdUpdateDatabase, UpdateDatabase{AccountID: "a2", UUID: uuidN(1)}, ErrNotFound},
		{CmdRelocateDatabase, RelocateDatabase{UUID: uuidN(9), FromObjectID: "o1", ObjectID: "o2", HostID: "h1"}, ErrNotFound},
		{CmdRelocateDatabase, RelocateDatabase{UUID: uuidN(1), FromObjectID: "o1", ObjectID: "o2", HostID: "h1"}, ErrConflict},
		{CmdSetHostState, SetHostState{ID: "nope", State: HostStateLost}, ErrNotFound},
		{CmdSetHostState, SetHostState{ID: "h1", State: HostStateLost, IdleSince: 1}, ErrConflict},
	}
	// A relocation to an object its host fenced as an orphan.
	fa := decodeValue[FenceAnswer](t, d.ok(CmdFenceOrphans, FenceOrphans{HostID: "h1", Objects: []ObjectRef{{UUID: uuidN(1), ObjectID: "o3"}}}))
	require.Equal(t, []string{"o3"}, fa.FencedObjects)
	cases = append(cases, struct {
		typ  CommandType
		body any
		want error
	}{CmdRelocateDatabase, RelocateDatabase{UUID: uuidN(1), FromObjectID: "obj-" + uuidN(1), ObjectID: "o3", HostID: "h1"}, ErrExists})
	for _, tc := range cases {
		r := d.do(tc.typ, tc.body)
		require.NotNil(t, r.Err, "%s %+v", tc.typ, tc.body)
		assert.ErrorIs(t, r.Err, tc.want, "%s %+v", tc.typ, tc.body)
		check(t, tc.typ, r)
	}
	// Every listed refusal is reachable (a list is not padded).
	for _, typ := range sortedTypes() {
		for _, e := range commands[typ].refusals() {
			code, _ := RefusalCode(e)
			assert.True(t, seen[typ][code], "%s lists %s but no case returned it", typ, code)
		}
	}
}
