package fsm

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// digestModel is what a host would compute: the active databases placed on
// each host, kept by the test from the commands it sends (not from the
// catalog), and the digests they imply.
type digestModel map[string]modelDB // uuid → row

type modelDB struct {
	host, object string
	gen          int64
}

func (m digestModel) buckets(host string) map[int]BucketDigest {
	out := map[int]BucketDigest{}
	for u, d := range m {
		if d.host != host {
			continue
		}
		b := DigestBucket(u)
		x := out[b]
		x.Bucket = b
		x.Digest ^= DigestOf(u, d.object, d.gen)
		x.Count++
		out[b] = x
	}
	return out
}

// query asks the catalog about every bucket the model has for host.
func (m digestModel) query(host string) DigestQuery {
	q := DigestQuery{HostID: host}
	for _, b := range m.buckets(host) {
		q.Buckets = append(q.Buckets, b)
	}
	return q
}

func digestsOf(t testing.TB, f *FSM, q DigestQuery) DigestAnswer {
	t.Helper()
	ans, err := f.HeartbeatDigests(context.Background(), q)
	require.NoError(t, err)
	return ans
}

// TestHostDigestsFollowEveryDatabaseChange: every command that changes an
// active database row's host, object, generation or state keeps
// host_digests equal to what the rows imply (checkInvariants recomputes it)
// and to what a host holding exactly those databases computes; refused
// commands change nothing.
func TestHostDigestsFollowEveryDatabaseChange(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 100)
	d.account("a2", 100)
	d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.1:1", Region: "weur", State: HostStateActive})
	d.ok(CmdRegisterHost, RegisterHost{ID: "h2", Address: "10.0.0.2:1", Region: "enam", State: HostStateActive})
	model := digestModel{}
	agree := func(what string) {
		t.Helper()
		checkInvariants(t, f)
		for _, h := range []string{"h1", "h2"} {
			ans := digestsOf(t, f, model.query(h))
			assert.Empty(t, ans.Differ, "%s: host %s", what, h)
		}
	}
	for i := 1; i <= 40; i++ {
		c := createDB(uuidN(i), []string{"a1", "a2"}[i%2], fmt.Sprintf("db%d", i))
		if i%3 == 0 {
			c.HostID = "h2"
		}
		d.ok(CmdCreateDatabase, c)
		model[c.UUID] = modelDB{c.HostID, c.ObjectID, 1}
	}
	agree("creates")

	// Refused: a name taken, a UUID reused. Nothing changes.
	r := d.do(CmdCreateDatabase, createDB(uuidN(99), "a2", "db1")) // db1 is a2's
	require.ErrorIs(t, r.Err, ErrNameTaken)
	r = d.do(CmdCreateDatabase, createDB(uuidN(1), "a1", "fresh"))
	require.ErrorIs(t, r.Err, ErrExists)
	agree("refused creates")

	for _, i := range []int{2, 3, 17} {
		d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: []string{"a1", "a2"}[i%2], UUID: uuidN(i)})
		delete(model, uuidN(i))
	}
	r = d.do(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(2)}) // already deleted
	require.ErrorIs(t, r.Err, ErrNotFound)
	agree("deletes")

	// Relocations: h1 → h2 and h2 → h1, each at generation + 1.
	for _, i := range []int{4, 6} {
		u := uuidN(i)
		to := map[string]string{"h1": "h2", "h2": "h1"}[model[u].host]
		obj := "moved-" + u
		d.ok(CmdRelocateDatabase, RelocateDatabase{UUID: u, FromObjectID: model[u].object, ObjectID: obj, HostID: to})
		model[u] = modelDB{to, obj, model[u].gen + 1}
	}
	r = d.do(CmdRelocateDatabase, RelocateDatabase{UUID: uuidN(5), FromObjectID: "not-its-object", ObjectID: "x-" + uuidN(5), HostID: "h2"})
	require.ErrorIs(t, r.Err, ErrConflict)
	agree("relocations")

	// Deleting a relocated database takes it out of its new host's digest.
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(4)})
	delete(model, uuidN(4))
	// Commands that do not change a placement leave digests alone.
	rr := ReadReplicationAuto
	d.ok(CmdUpdateDatabase, UpdateDatabase{AccountID: "a2", UUID: uuidN(5), ReadReplication: &rr})
	agree("delete after relocation, update")

	// A snapshot restores the same digests.
	g := newFSM(t)
	require.NoError(t, restoreBytes(g, snapshotBytes(t, f)))
	checkInvariants(t, g)
	assert.Equal(t, dump(t, f), dump(t, g))
}

// TestHeartbeatDigestsAnswerExactlyTheChangedBuckets: a host that missed a
// delete, a relocation away, a generation bump or a create has exactly those
// buckets answered different; an empty bucket on the catalog's side differs
// from a host bucket that still holds a database.
func TestHeartbeatDigestsAnswerExactlyTheChangedBuckets(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 1000)
	d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.1:1", Region: "weur", State: HostStateActive})
	d.ok(CmdRegisterHost, RegisterHost{ID: "h2", Address: "10.0.0.2:1", Region: "weur", State: HostStateActive})
	host := digestModel{} // what h1 believes
	for i := 1; i <= 300; i++ {
		c := createDB(uuidN(i), "a1", fmt.Sprintf("db%d", i))
		d.ok(CmdCreateDatabase, c)
		host[c.UUID] = modelDB{"h1", c.ObjectID, 1}
	}
	require.Empty(t, digestsOf(t, f, host.query("h1")).Differ)

	// The catalog changes behind the host's back.
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(10)})
	d.ok(CmdRelocateDatabase, RelocateDatabase{UUID: uuidN(20), FromObjectID: host[uuidN(20)].object, ObjectID: "new-20", HostID: "h2"})
	want := map[int]bool{DigestBucket(uuidN(10)): true, DigestBucket(uuidN(20)): true}
	// The host holds an object the catalog never committed (an orphan).
	host[uuidN(5000)] = modelDB{"h1", "orphan", 1}
	want[DigestBucket(uuidN(5000))] = true
	var wantList []int
	for b := range want {
		wantList = append(wantList, b)
	}
	ans := digestsOf(t, f, host.query("h1"))
	assert.ElementsMatch(t, wantList, ans.Differ)
	assert.IsIncreasing(t, ans.Differ)

	// Learning the changes (as per-database heartbeats teach it) makes the
	// buckets equal again.
	delete(host, uuidN(10))
	delete(host, uuidN(20))
	delete(host, uuidN(5000))
	assert.Empty(t, digestsOf(t, f, host.query("h1")).Differ)

	// The host's view of a generation is part of the digest.
	x := host[uuidN(30)]
	x.gen = 2
	host[uuidN(30)] = x
	assert.Equal(t, []int{DigestBucket(uuidN(30))}, digestsOf(t, f, host.query("h1")).Differ)

	// An unknown host: every bucket it holds differs.
	q := host.query("h1")
	q.HostID = "h9"
	assert.Len(t, digestsOf(t, f, q).Differ, len(q.Buckets))
}

func TestHeartbeatDigestsAnswerAccountsOnce(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	d.account("a2", 20)
	ans := digestsOf(t, f, DigestQuery{HostID: "h1", Accounts: []string{"a1", "a2", "nope"}})
	assert.Empty(t, ans.Differ)
	require.Len(t, ans.Accounts, 2)
	assert.Equal(t, int64(10), ans.Accounts["a1"].Limits.MaxDatabases)
	assert.Equal(t, int64(20), ans.Accounts["a2"].Limits.MaxDatabases)
	// The same account rows as a per-database heartbeat answers.
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	hb, err := f.Heartbeat(context.Background(), []string{uuidN(1)})
	require.NoError(t, err)
	ans = digestsOf(t, f, DigestQuery{HostID: "h1", Accounts: []string{"a1"}})
	assert.Equal(t, hb.Accounts["a1"], ans.Accounts["a1"])
}

func TestDigestQueryRefusesBadInput(t *testing.T) {
	f := newFSM(t)
	many := make([]BucketDigest, DigestBuckets+1)
	for i := range many {
		many[i].Bucket = i % DigestBuckets
	}
	for name, q := range map[string]DigestQuery{
		"no host":         {Buckets: []BucketDigest{{Bucket: 1}}},
		"bucket too high": {HostID: "h1", Buckets: []BucketDigest{{Bucket: DigestBuckets}}},
		"negative bucket": {HostID: "h1", Buckets: []BucketDigest{{Bucket: -1}}},
		"bucket twice":    {HostID: "h1", Buckets: []BucketDigest{{Bucket: 3}, {Bucket: 3}}},
		"negative count":  {HostID: "h1", Buckets: []BucketDigest{{Bucket: 3, Count: -1}}},
		"too many":        {HostID: "h1", Buckets: many},
		"bad account":     {HostID: "h1", Accounts: []string{""}},
	} {
		_, err := f.HeartbeatDigests(context.Background(), q)
		assert.ErrorIs(t, err, ErrInvalid, name)
	}
}

func TestBucketDigestJSONIsAnArray(t *testing.T) {
	b, err := json.Marshal(DigestQuery{HostID: "h1", Buckets: []BucketDigest{{Bucket: 7, Digest: 1 << 62, Count: 3}}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"host_id":"h1","buckets":[[7,4611686018427387904,3]]}`, string(b))
	var q DigestQuery
	require.NoError(t, json.Unmarshal(b, &q))
	assert.Equal(t, BucketDigest{Bucket: 7, Digest: 1 << 62, Count: 3}, q.Buckets[0])
}
