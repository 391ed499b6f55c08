package objecthost

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const indexChildEnv = "SHOAL_TEST_INDEX_CHILD_DIR"

// TestIndexKilledProcessKeepsAcknowledged kills (SIGKILL) a process that
// writes the index as fast as it can, with a checkpoint every few dozen
// commits, and checks the files it left: every put it acknowledged is
// there unless it acknowledged a remove of that record later, and no
// record it acknowledged removing is there. The kill lands wherever the
// child is: mid-append, between an fdatasync and the overlay, inside a
// checkpoint. Three kills at different points.
func TestIndexKilledProcessKeepsAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for round := range 3 {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestIndexChildWriter$", "-test.count=1")
		cmd.Env = append(os.Environ(), indexChildEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		present := map[string]bool{} // acknowledged state of each record
		sc := bufio.NewScanner(out)
		killAt := 1500 + 700*round
		acks := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 2 || (f[0] != "put" && f[0] != "rm") {
				continue
			}
			present[f[1]] = f[0] == "put"
			if acks++; acks == killAt {
				require.NoError(t, cmd.Process.Kill()) // the acknowledgements it printed before dying are still read
			}
		}
		_ = cmd.Wait()
		require.GreaterOrEqual(t, acks, killAt, "the child died early")

		ix, _ := openTestIndex(t, filepath.Join(dir, "index.db"))
		got := indexRecords(t, ix)
		require.NoError(t, ix.close())
		for id, want := range present {
			_, kept := got[id]
			if want {
				require.True(t, kept, "round %d: the acknowledged put of %s was lost", round, id)
			} else {
				require.False(t, kept, "round %d: the acknowledged remove of %s was undone", round, id)
			}
		}
		t.Logf("round %d: killed after %d acknowledgements; %d records kept", round, acks, len(got))
	}
}

// TestIndexChildWriter is the child of TestIndexKilledProcessKeepsAcknowledged:
// it runs only with indexChildEnv set, and writes until killed, printing
// each acknowledgement after it returned.
func TestIndexChildWriter(t *testing.T) {
	dir := os.Getenv(indexChildEnv)
	if dir == "" {
		t.Skip("the child of TestIndexKilledProcessKeepsAcknowledged")
	}
	ix, err := openIndex(filepath.Join(dir, "index.db"), nil)
	require.NoError(t, err)
	ix.checkpointBytes.Store(16 << 10)
	w := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		id := "o" + strconv.Itoa(i)
		require.NoError(t, ix.put(&Meta{ObjectID: id, State: StateActive, CreatedAt: time.Now()}))
		fmt.Fprintln(w, "put", id)
		if i%3 == 2 {
			old := "o" + strconv.Itoa(i-1)
			require.NoError(t, ix.remove(old))
			fmt.Fprintln(w, "rm", old)
		}
		require.NoError(t, w.Flush())
	}
}
