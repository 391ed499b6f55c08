package topology

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Nodes are the members' network nodes.
func Nodes(ms ...*Member) []*Node {
	var out []*Node
	for _, m := range ms {
		out = append(out, m.Node())
	}
	return out
}

// Names are the members' names, for a failpoint's target.
func Names(ms ...*Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// CutOffCatalog takes every catalog node's port off the bridge: no host,
// edge or test reaches any catalog node, and each catalog node is alone (no
// quorum): the seed design's "central catalog cut off". RejoinCatalog
// undoes it.
func (c *Cluster) CutOffCatalog() error {
	var errs []error
	for _, m := range c.Catalog {
		errs = append(errs, m.Node().Isolate())
	}
	if err := errors.Join(errs...); err != nil {
		_ = c.RejoinCatalog()
		return err
	}
	return nil
}

// RejoinCatalog undoes CutOffCatalog.
func (c *Cluster) RejoinCatalog() error {
	var errs []error
	for _, m := range c.Catalog {
		errs = append(errs, m.Node().Rejoin())
	}
	return errors.Join(errs...)
}

// PurgeRoutes asks every edge to drop its route cache (POST
// /admin/v1/routes/purge), as an operator's mass purge does.
func (c *Cluster) PurgeRoutes(ctx context.Context) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	var errs []error
	for _, e := range c.Edges {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.Addr+"/admin/v1/routes/purge", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+c.Admin)
		resp, err := hc.Do(req)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			errs = append(errs, fmt.Errorf("purge on %s: status %d", e.Name, resp.StatusCode))
		}
	}
	return errors.Join(errs...)
}

// ToggleEdgeFailpoints sends SIGUSR1 to every edge: the failpoints their
// SHOAL_FAILPOINTS environment names (Options.EdgeEnv) flip between armed
// and disarmed.
func (c *Cluster) ToggleEdgeFailpoints() error {
	var errs []error
	for _, e := range c.Edges {
		errs = append(errs, e.Signal(syscall.SIGUSR1))
	}
	return errors.Join(errs...)
}

// ToggleConsumers sends SIGUSR1 to the pipeline node's shoal process (not
// its clickhouse-server child): the failpoints Options.PipelineEnv's
// SHOAL_FAILPOINTS names (consumers:stall stops the storage consumer and
// the ClickHouse sink; the broker keeps serving) flip between armed and
// disarmed.
func (c *Cluster) ToggleConsumers() error {
	if c.Pipeline == nil {
		return errors.New("no pipeline node")
	}
	return c.Pipeline.SignalLeader(syscall.SIGUSR1)
}

// StoreFault sets the object store's injected misbehaviour (cmd/s3node's
// POST /admin/fault): "503", "slow" with delay, or "none".
func (c *Cluster) StoreFault(ctx context.Context, mode string, delay time.Duration) error {
	if c.ObjectStore == nil {
		return errors.New("no object store")
	}
	u := "http://" + c.ObjectStore.Addr + "/admin/fault?mode=" + mode
	if mode == "slow" {
		u += "&delay=" + delay.String()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("s3node fault %s: %s: %s", mode, resp.Status, b)
	}
	return nil
}

// LostObject is one archive object the store lost (cmd/s3node's
// mode=lose): its key in the bucket (with the archive prefix) and how.
type LostObject struct {
	Key string `json:"key"`
	How string `json:"how"` // "delete" or "corrupt"
}

// DB is the database UUID the object belongs to.
func (l LostObject) DB() string {
	k := strings.TrimPrefix(l.Key, ArchivePrefix)
	if i := strings.IndexByte(k, '/'); i > 0 {
		return k[:i]
	}
	return ""
}

// StoreLose has the object store lose n objects it acknowledged, deleting
// or corrupting them (how: delete, corrupt or mixed), chosen with seed
// (cmd/s3node's POST /admin/fault?mode=lose), and returns what it hit.
func (c *Cluster) StoreLose(ctx context.Context, n int, how string, seed uint64) ([]LostObject, error) {
	if c.ObjectStore == nil {
		return nil, errors.New("no object store")
	}
	u := fmt.Sprintf("http://%s/admin/fault?mode=lose&n=%d&how=%s&seed=%d", c.ObjectStore.Addr, n, how, seed)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("s3node lose: %s: %s", resp.Status, b)
	}
	var out []LostObject
	return out, json.NewDecoder(resp.Body).Decode(&out)
}

// ScrubHost has host check every live database's archive now, reading
// every object (POST /v1/history/scrub?sample=-1), and returns its
// scrubber's state.
func (c *Cluster) ScrubHost(ctx context.Context, host *Member) (ScrubStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, host.URL("/v1/history/scrub?sample=-1"), nil)
	if err != nil {
		return ScrubStatus{}, err
	}
	// The members' clients time out after 2 s; a full scrub of a host's
	// archive takes longer (bounded by ctx instead).
	hc := &http.Client{Transport: host.HTTP.Transport}
	resp, err := hc.Do(req)
	if err != nil {
		return ScrubStatus{}, err
	}
	defer resp.Body.Close()
	var env struct {
		Result  ScrubStatus `json:"result"`
		Success bool        `json:"success"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return ScrubStatus{}, fmt.Errorf("%s scrub: %w", host.Name, err)
	}
	if resp.StatusCode != http.StatusOK || !env.Success {
		return ScrubStatus{}, fmt.Errorf("%s scrub: %s", host.Name, resp.Status)
	}
	return env.Result, nil
}

// ColdRestart kills m with -9, empties its data directory (for an edge: its
// route cache and every token it validated) and starts it again: a fresh
// member that knows nothing yet. It returns once m is healthy.
func (c *Cluster) ColdRestart(ctx context.Context, m *Member) error {
	if err := m.Kill(); err != nil {
		return err
	}
	entries, err := os.ReadDir(m.Dir)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(m.Dir, e.Name())); err != nil {
			return err
		}
	}
	if err := m.Start(); err != nil {
		return err
	}
	return waitHealthy(ctx, m, 60*time.Second)
}

// ballast is the file FillDisk writes into a data directory.
const ballast = "robustness-ballast"

// FillDisk fills the file system holding dir to its last byte (a tmpfs of
// Options.HostDisk, not the machine's disk), so every write of the process
// using dir fails with ENOSPC. FreeDisk removes the ballast.
func FillDisk(dir string) error {
	path := filepath.Join(dir, ballast)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return err
	}
	if avail := int64(st.Bavail) * st.Bsize; avail > 0 {
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, avail); err != nil && !errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("fallocate %d bytes: %w", avail, err)
		}
	}
	// Whatever fallocate left (rounding), byte by block until ENOSPC.
	if _, err := f.Seek(0, 2); err != nil {
		return err
	}
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return err
		}
	}
}

// FreeDisk removes FillDisk's ballast.
func FreeDisk(dir string) error {
	err := os.Remove(filepath.Join(dir, ballast))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// ClickHouse is the pipeline node's managed clickhouse-server as a process
// the stop-cont failpoint can pause (the pipeline restarts nothing: a
// paused server is ClickHouse unresponsive, then back). Found by its data
// directory under the pipeline node's.
func (c *Cluster) ClickHouse() (*PidProc, error) {
	if c.Pipeline == nil {
		return nil, errors.New("no pipeline node")
	}
	out, err := exec.Command("pgrep", "-f", "--", "--config-file="+c.Pipeline.Dir).Output()
	if err != nil {
		return nil, fmt.Errorf("pgrep clickhouse-server under %s: %w", c.Pipeline.Dir, err)
	}
	var pid int
	if _, err := fmt.Sscanf(string(out), "%d", &pid); err != nil {
		return nil, fmt.Errorf("pgrep: %q: %w", out, err)
	}
	return &PidProc{Pid: pid}, nil
}

// PidProc is a process the suite did not start (signals only).
type PidProc struct{ Pid int }

// Signal sends sig to the process.
func (p *PidProc) Signal(sig syscall.Signal) error { return syscall.Kill(p.Pid, sig) }

// Kill is not offered: nothing would restart the process.
func (p *PidProc) Kill() error {
	return errors.New("PidProc: kill not supported (nothing restarts it)")
}

// Start is not offered.
func (p *PidProc) Start() error { return errors.New("PidProc: start not supported") }

// HistoryStatus is an object host's GET /v1/history/status: its shipper's
// view of the archive (objecthost/history/DESIGN.md, "Metrics and status").
type HistoryStatus struct {
	LagSeconds float64     `json:"lag_seconds"`       // age of the oldest commit not yet in the store
	Alarm      bool        `json:"alarm"`             // lag past the archive block's alarm_lag
	Backlog    int         `json:"backlog_databases"` // databases with unshipped records
	LastError  string      `json:"last_error"`
	Scrub      ScrubStatus `json:"scrub"`
}

// ScrubStatus is the archive scrubber's part of a host's history status
// (objecthost.ScrubStatus).
type ScrubStatus struct {
	Passes   int64           `json:"passes"`
	Checked  int64           `json:"databases_checked"`
	Errors   int64           `json:"store_errors"`
	DamagedN int             `json:"damaged_databases"`
	Damaged  []ArchiveDamage `json:"damaged"`
}

// ArchiveDamage is one database's damage as its host reports it.
type ArchiveDamage struct {
	Database string `json:"database"`
	Lost     []struct {
		Gen       string `json:"gen"`
		FirstTxid uint64 `json:"first_txid"`
		LastTxid  uint64 `json:"last_txid"`
		After     string `json:"after_bookmark"`
		Until     string `json:"until_bookmark"`
	} `json:"lost"`
	Damaged  []string `json:"damaged_objects"`
	Missing  []string `json:"missing"`
	HealedAt string   `json:"healed_at"`
}

// HistoryStatus reads host's shipper status.
func (c *Cluster) HistoryStatus(ctx context.Context, host *Member) (HistoryStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, host.URL("/v1/history/status"), nil)
	if err != nil {
		return HistoryStatus{}, err
	}
	resp, err := host.HTTP.Do(req)
	if err != nil {
		return HistoryStatus{}, err
	}
	defer resp.Body.Close()
	var env struct {
		Result  HistoryStatus `json:"result"`
		Success bool          `json:"success"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return HistoryStatus{}, fmt.Errorf("%s history status: %w", host.Name, err)
	}
	if resp.StatusCode != http.StatusOK || !env.Success {
		return HistoryStatus{}, fmt.Errorf("%s history status: %s", host.Name, resp.Status)
	}
	return env.Result, nil
}
