package wrangler

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tested are the wrangler commands wranglerFlow runs, as docs/clients.md's
// table names them, with what the test asserts for 3.x and 4.x.
var tested = map[string][2]string{
	"`whoami`":                                 {"yes", "yes"},
	"`d1 create NAME --location HINT`":         {"yes", "yes"},
	"`d1 create NAME --jurisdiction J`":        {"no: 3.x has no `--jurisdiction`", "yes"},
	"`d1 list`":                                {"yes", "yes"},
	"`d1 info NAME`":                           {"yes", "yes"},
	"`d1 execute NAME --remote --command SQL`": {"yes", "yes"},
	"`d1 execute NAME --remote --file FILE`":   {"yes", "yes"},
	"`d1 export NAME --remote --output FILE` (also `--no-data`, `--no-schema`, `--table T`)": {"yes", "yes"},
	"`d1 migrations create / list --remote / apply --remote`":                                {"yes", "yes"},
	"`d1 insights NAME` (every `--sort-by`, `--sort-type`, `--sort-direction`)":              {"yes", "yes"},
	"`d1 time-travel info NAME`, `d1 time-travel restore NAME --bookmark B` (and undo)":      {"yes", "yes"},
	"`d1 delete NAME -y`":                              {"yes", "yes"},
	"any of the above without `CLOUDFLARE_ACCOUNT_ID`": {"yes", "yes"},
	"`d1 execute/export --local`":                      {"yes", "yes"},
}

// TestClientsDoc: docs/clients.md's table of wrangler commands is the list
// this package's test runs, with the same verdicts.
func TestClientsDoc(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "clients.md"))
	require.NoError(t, err)
	rows := map[string][2]string{}
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "| command |") {
			in = true
			continue
		}
		if in && !strings.HasPrefix(l, "|") {
			break
		}
		if !in || strings.HasPrefix(l, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), " | ")
		require.GreaterOrEqual(t, len(cells), 3, "%q", l)
		rows[strings.TrimSpace(cells[0])] = [2]string{strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])}
	}
	assert.Equal(t, tested, rows)
}
