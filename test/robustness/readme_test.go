package robustness

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/robustness/failpoint"
)

// The README's failpoint table documents every failpoint kind, and only
// those.
func TestReadmeListsEveryFailpoint(t *testing.T) {
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	var rows []string
	_, section, ok := strings.Cut(string(b), "\n## Failpoints\n")
	require.True(t, ok, "README has a Failpoints section")
	section, _, _ = strings.Cut(section, "\n## ")
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "| `") && strings.Count(line, "|") == 4 {
			rows = append(rows, strings.Trim(strings.Fields(line)[1], "`"))
		}
	}
	var kinds []string
	for _, k := range failpoint.Kinds() {
		kinds = append(kinds, string(k))
	}
	assert.Equal(t, kinds, rows, "README failpoint table vs failpoint.Kinds()")
}
