package raftmeta

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// The storage pages through the HTTP API and the client, stale reads
// spread over three nodes, while sizes keep changing: every database once
// per walk, and once the writes stop, exactly the catalog's figures.
func TestClientStoragePagesUnderConcurrentUpdates(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	cl, err := NewClient(tc.addrs(), WithCacheTTL(0))
	require.NoError(t, err)
	defer cl.Close()
	ctx := context.Background()

	accounts := []string{"acct-a", "acct-b", "acct-c"}
	owner := map[string]string{}
	var uuids []string
	for _, a := range accounts {
		_, err := cl.CreateAccount(ctx, newAccount(a, 1000))
		require.NoError(t, err)
	}
	_, err = cl.CreateAccount(ctx, newAccount("acct-empty", 10))
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				d := newDB(accounts[(w+i)%len(accounts)])
				_, err := cl.CreateDatabase(ctx, d)
				assert.NoError(t, err)
				mu.Lock()
				uuids, owner[d.UUID] = append(uuids, d.UUID), d.AccountID
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	sort.Strings(uuids)
	size := func(u string, seq int64) int64 { return int64(len(u))*seq + seq }

	var stats []fsm.DatabaseStat
	for _, u := range uuids {
		stats = append(stats, fsm.DatabaseStat{UUID: u, SizeBytes: size(u, 1), Seq: 1})
	}
	_, err = cl.SetDatabaseStats(ctx, stats)
	require.NoError(t, err)

	walk := func() []fsm.DatabaseStorage {
		var out []fsm.DatabaseStorage
		after := ""
		for {
			p, err := cl.DatabaseStoragePage(ctx, after, 17, StaleRead())
			require.NoError(t, err)
			out = append(out, p.Databases...)
			if p.Next == "" {
				return out
			}
			after = p.Next
		}
	}

	// Stale pages may lag the write just acknowledged by a few ms; once
	// every node has the sizes, every walk must see every database.
	require.Eventually(t, func() bool { return len(walk()) == len(uuids) }, time.Minute, 20*time.Millisecond)

	stop, exited := make(chan struct{}), make(chan struct{})
	var seq int64 = 1
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(exited)
		for s := int64(2); ; s++ {
			select {
			case <-stop:
				return
			default:
			}
			batch := make([]fsm.DatabaseStat, 0, 50)
			for j := 0; j < 50; j++ {
				u := uuids[(int(s)*31+j*7)%len(uuids)]
				batch = append(batch, fsm.DatabaseStat{UUID: u, SizeBytes: size(u, s), Seq: s})
			}
			if _, err := cl.SetDatabaseStats(ctx, batch); !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			seq = s
			mu.Unlock()
		}
	}()
	// At least four walks, and as many more as it takes for the writer to
	// land a batch while they run (on a loaded machine it may not have
	// landed one within four walks; waiting for it is the event, not a
	// timing).
	progressed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seq > 2
	}
	for round := 0; round < 4 || !progressed(); round++ {
		select {
		case <-exited:
			require.FailNow(t, "the writer stopped before landing a batch during the walks")
		default:
		}
		got := walk()
		require.Len(t, got, len(uuids))
		for i, g := range got {
			require.Equal(t, uuids[i], g.UUID, "every database once, in order")
			require.Equal(t, owner[g.UUID], g.AccountID)
		}
	}
	close(stop)
	wg.Wait()

	// Quiet catalog: a linearizable walk is the truth; the account pages'
	// totals equal the sums once drained.
	want := map[string]int64{}
	var truth []fsm.DatabaseStorage
	after := ""
	for {
		p, err := cl.DatabaseStoragePage(ctx, after, fsm.MaxStoragePage, LinearizableRead())
		require.NoError(t, err)
		truth = append(truth, p.Databases...)
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	require.Len(t, truth, len(uuids))
	for _, d := range truth {
		want[d.AccountID] += d.SizeBytes
	}
	require.Eventually(t, func() bool {
		p, err := cl.AccountStoragePage(ctx, "", 0, LinearizableRead())
		require.NoError(t, err)
		got := map[string]int64{}
		for _, a := range p.Accounts {
			got[a.AccountID] = a.StorageBytes
		}
		want["acct-empty"] = 0
		return assert.ObjectsAreEqual(want, got)
	}, time.Minute, 50*time.Millisecond, "account totals never equalled the sums of their sizes")
	p, err := cl.AccountStoragePage(ctx, "acct-a", 1, StaleRead())
	require.NoError(t, err)
	require.Len(t, p.Accounts, 1)
	assert.Equal(t, "acct-b", p.Accounts[0].AccountID)
	assert.Equal(t, "acct-b", p.Next)
	nb := 0
	for _, a := range owner {
		if a == "acct-b" {
			nb++
		}
	}
	assert.Equal(t, int64(nb), p.Accounts[0].ActiveDatabases)
}

func TestStorageEndpointRefusals(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	base := "http://" + tc.nodes[0].HTTPAddr()
	for _, c := range []struct {
		path string
		code int
		err  string
	}{
		{"/v1/storage/databases?limit=10001", 400, fsm.CodeInvalid},
		{"/v1/storage/databases?limit=0", 400, fsm.CodeInvalid},
		{"/v1/storage/databases?limit=x", 400, fsm.CodeInvalid},
		{"/v1/storage/databases?after=NOT-A-UUID", 400, fsm.CodeInvalid},
		{"/v1/storage/accounts?after=" + strings.Repeat("x", 65), 400, fsm.CodeInvalid},
		{"/v1/storage/hosts", 404, fsm.CodeNotFound},
		{"/v1/storage/databases?consistency=stale&limit=10000", 200, ""},
		{"/v1/storage/accounts", 200, ""},
	} {
		resp, err := http.Get(base + c.path)
		require.NoError(t, err)
		var body struct {
			Error  *wireError      `json:"error"`
			Result json.RawMessage `json:"result"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		assert.Equal(t, c.code, resp.StatusCode, c.path)
		if c.err != "" {
			require.NotNil(t, body.Error, c.path)
			assert.Equal(t, c.err, body.Error.Code, c.path)
		} else {
			assert.Nil(t, body.Error, c.path)
			assert.NotEmpty(t, body.Result, c.path)
		}
	}
}
