package harness

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// ScrapeMetrics reads the Prometheus text exposition at url into
// name{labels} → value; comments and unparsable samples are left out.
func ScrapeMetrics(t testing.TB, url string) map[string]float64 {
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// RaftmetaReads sums shoal_raftmeta_reads_total (every consistency level and
// outcome) over the /metrics of the catalog nodes serving HTTP on addrs.
// Safe from any goroutine.
func RaftmetaReads(addrs []string) (int64, error) {
	var total float64
	for _, a := range addrs {
		resp, err := client.Get("http://" + a + "/metrics")
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "shoal_raftmeta_reads_total{") {
				continue
			}
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				_ = resp.Body.Close()
				return 0, fmt.Errorf("metrics line %q: %w", line, err)
			}
			total += v
		}
		_ = resp.Body.Close()
		if err := sc.Err(); err != nil {
			return 0, err
		}
	}
	return int64(total), nil
}
