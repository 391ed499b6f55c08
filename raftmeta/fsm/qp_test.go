package fsm

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadQueriesUseIndexes checks the query plans of the catalog's hot
// reads: no full scan of a table (json_each in Heartbeat is the input list).
func TestReadQueriesUseIndexes(t *testing.T) {
	f := newFSM(t)
	queries := map[string]string{
		"database":      `SELECT ` + databaseCols + ` FROM ` + databaseFrom + ` WHERE d.uuid = 'x'`,
		"database name": `SELECT ` + databaseCols + ` FROM ` + databaseFrom + ` WHERE d.account_id = 'a' AND d.name = 'b' AND d.state = 'active'`,
		"account":       `SELECT ` + accountCols + ` FROM ` + accountFrom + ` WHERE a.id = 'x'`,
		"name taken":    `SELECT 1 FROM databases WHERE account_id = 'a' AND name = 'b' AND state = 'active'`,
		"token by hash": `SELECT ` + tokenCols + ` FROM api_tokens WHERE hash = 'x'`,
		"pending":       pendingChangesQuery,
		"list page": `SELECT ` + databaseCols + ` FROM ` + databaseFrom + ` WHERE d.id IN (
			SELECT d.id FROM databases d WHERE d.account_id = 'a' AND d.state = 'active'
			ORDER BY d.created_at, d.uuid LIMIT 100 OFFSET 100) ORDER BY d.created_at, d.uuid`,
	}
	for name, q := range queries {
		rows, err := f.rdb.QueryContext(context.Background(), `EXPLAIN QUERY PLAN `+q)
		require.NoError(t, err, name)
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
			plan = append(plan, detail)
		}
		require.NoError(t, rows.Close())
		joined := strings.Join(plan, "; ")
		for _, step := range plan {
			assert.False(t, strings.HasPrefix(step, "SCAN ") && step != "SCAN CONSTANT ROW", "%s does a full scan: %s", name, joined)
		}
		if name == "list page" {
			assert.Contains(t, joined, "COVERING INDEX databases_active_list", "list page skips rows in the index")
			assert.Equal(t, 1, strings.Count(joined, "TEMP B-TREE"), "only the final 100 rows are sorted: %s", joined)
		}
		t.Logf("%s: %s", name, joined)
	}
}
