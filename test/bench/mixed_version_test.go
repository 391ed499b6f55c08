package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// TestCatalogMixedVersions checks a rolling upgrade's catalog group: three
// voters as separate processes with mutual TLS, one of them another build
// (SHOAL_BENCH_BASELINE_BIN, e.g. main's) — first the bootstrapped leader,
// then a follower — and 64 writers creating databases through the
// coalescing client for 5 s, every tenth a name already taken (a refusal).
// Then every node's backup is restored into this build's FSM and dumped:
// the three catalogs must be identical, and the account's active count
// must equal the creates acknowledged. It guards changes to how the FSM
// applies entries (raftmeta/DESIGN.md, "The FSM's work per create").
//
//	go build -o /tmp/main-shoal ./cmd/shoal   # in a checkout of the other build
//	SHOAL_BENCH_BASELINE_BIN=/tmp/main-shoal go test ./test/bench -run TestCatalogMixedVersions -v -count=1
func TestCatalogMixedVersions(t *testing.T) {
	mainBin := os.Getenv("SHOAL_BENCH_BASELINE_BIN")
	if mainBin == "" {
		t.Skip("set SHOAL_BENCH_BASELINE_BIN to another build's shoal binary")
	}
	for _, mainAt := range []int{0, 2} { // the other build as the bootstrapped leader, then as a follower
		t.Run(fmt.Sprintf("other-build-at-c%d", mainAt+1), func(t *testing.T) {
			ports := newPortAlloc(t)
			p := harness.NewPKI(t)
			dir := t.TempDir()
			ops := p.HTTPClient(t, "ops", pki.RoleOperator)
			var addrs []string
			for i := range 3 {
				bin := shoalBin.Path(t)
				if i == mainAt {
					bin = mainBin
				}
				id := fmt.Sprintf("c%d", i+1)
				addr := ports.next()
				args := []string{"raftmeta", "serve", "--id", id, "--dir", filepath.Join(dir, id), "--raft-addr", ports.next(),
					"--http-addr", addr, "--log-level", "warn"}
				if i == 0 {
					args = append(args, "--bootstrap")
				} else {
					args = append(args, "--join", addrs[0])
				}
				proc := harness.StartProc(t, bin, id, append(args, p.Args(t, id, pki.RoleCatalog)...)...)
				harness.WaitHTTP200With(t, ops, "https://"+addr+"/readyz", 30*time.Second, "catalog %s never ready: %s", id, proc.Log)
				addrs = append(addrs, addr)
			}
			cl, err := raftmeta.NewClient(addrs, raftmeta.WithCacheTTL(0), raftmeta.WithTLS(p.Loader(t, "bench", pki.RoleEdge, pki.RoleOperator)))
			require.NoError(t, err)
			defer cl.Close()
			ctx := context.Background()
			_, err = cl.CreateAccount(ctx, fsm.CreateAccount{ID: "acct", Name: "acct", Tier: fsm.TierPaid,
				Limits: fsm.Limits{MaxDatabases: 1 << 40, MaxStorageBytes: 1 << 50, MaxDatabaseBytes: 1 << 30}})
			require.NoError(t, err)
			var n, refused atomic.Int64
			var wg sync.WaitGroup
			stop := time.Now().Add(5 * time.Second)
			for w := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; time.Now().Before(stop); i++ {
						name := fmt.Sprintf("db-%d-%d", w, i)
						if i%10 == 9 {
							name = fmt.Sprintf("db-%d-%d", w, i-1) // name taken: a refusal
						}
						_, err := cl.CreateDatabase(ctx, fsm.CreateDatabase{UUID: ids.New(), AccountID: "acct", Name: name,
							ObjectID: ids.New(), HostID: fmt.Sprintf("h%d", i%3), Region: "weur"})
						if fsm.IsRefusal(err) {
							refused.Add(1)
							continue
						}
						require.NoError(t, err)
						n.Add(1)
					}
				}()
			}
			wg.Wait()
			t.Logf("%d creates acknowledged, %d refused", n.Load(), refused.Load())
			acct, err := cl.Account(ctx, "acct", raftmeta.LinearizableRead())
			require.NoError(t, err)
			require.Equal(t, n.Load(), acct.ActiveDatabases)
			var dumps []string
			for i, a := range addrs {
				var buf bytes.Buffer
				idx, _, err := raftmeta.NewAdmin(a, 30*time.Second, p.Loader(t, "ops", pki.RoleOperator)).Backup(ctx, &buf)
				require.NoError(t, err)
				f, err := fsm.New(t.TempDir())
				require.NoError(t, err)
				require.NoError(t, f.Restore(io.NopCloser(&buf)))
				d, err := f.Dump(ctx)
				require.NoError(t, err)
				f.Close()
				t.Logf("c%d: backup at index %d, dump %d bytes", i+1, idx, len(d))
				dumps = append(dumps, d)
			}
			for i := 1; i < 3; i++ {
				if dumps[i] != dumps[0] {
					t.Fatalf("c1 and c%d hold different catalogs: %s", i+1, firstDumpDiff(dumps[0], dumps[i]))
				}
			}
		})
	}
}

// firstDumpDiff shows the first differing line of two catalog dumps (they
// run to megabytes).
func firstDumpDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < min(len(al), len(bl)); i++ {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d: %q against %q", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d lines against %d", len(al), len(bl))
}
