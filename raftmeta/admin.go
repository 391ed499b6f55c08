package raftmeta

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Admin performs cluster operations against one node's HTTP API (the
// `shoal cluster` commands). Leader-only operations sent to a follower fail
// with a *NotLeaderError naming the leader; Admin does not follow it, so an
// operator always knows which node acted.
type Admin struct {
	addr   string
	hc     *http.Client
	scheme string
}

// NewAdmin returns an Admin of the node at addr (host:port of its HTTP
// API). A tls Loader, when given (and not nil), authenticates with an
// operator's certificate.
func NewAdmin(addr string, timeout time.Duration, tls ...*pki.Loader) *Admin {
	var l *pki.Loader
	if len(tls) > 0 {
		l = tls[0]
	}
	return &Admin{addr: addr, hc: &http.Client{Timeout: timeout, Transport: l.Transport(&http.Transport{}, pki.RoleCatalog)}, scheme: l.Scheme()}
}

func (a *Admin) call(ctx context.Context, method, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, a.scheme+"://"+a.addr+path, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: cannot reach a raftmeta node at %s: %v", ErrUnavailable, a.addr, err)
	}
	defer resp.Body.Close()
	if err := decodeAnswer(resp, out); err != nil {
		if errors.Is(err, errTransport) {
			return fmt.Errorf("%s does not answer like a raftmeta node: %w", a.addr, err)
		}
		return err
	}
	return nil
}

func jsonBody(v any) io.Reader {
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

// Status returns the cluster status as the node sees it.
func (a *Admin) Status(ctx context.Context) (ClusterStatus, error) {
	var st ClusterStatus
	err := a.call(ctx, http.MethodGet, "/v1/cluster/status", nil, &st)
	return st, err
}

// Bootstrap makes the node, which must have no Raft state, the first member
// (with servers, the initial membership).
func (a *Admin) Bootstrap(ctx context.Context, servers []JoinRequest) error {
	return a.call(ctx, http.MethodPost, "/v1/cluster/bootstrap", jsonBody(BootstrapRequest{Servers: servers}), nil)
}

// Join asks the node (the leader) to add a member.
func (a *Admin) Join(ctx context.Context, r JoinRequest) error {
	return a.call(ctx, http.MethodPost, "/v1/cluster/join", jsonBody(r), nil)
}

// Remove asks the node (the leader) to remove a member.
func (a *Admin) Remove(ctx context.Context, id string) error {
	return a.call(ctx, http.MethodPost, "/v1/cluster/remove", jsonBody(RemoveRequest{ID: id}), nil)
}

// Snapshot forces a snapshot on the node and returns its index.
func (a *Admin) Snapshot(ctx context.Context) (uint64, error) {
	var out struct {
		Index uint64 `json:"index"`
	}
	err := a.call(ctx, http.MethodPost, "/v1/cluster/snapshot", nil, &out)
	return out.Index, err
}

// Backup streams a consistent catalog copy into w; it returns the Raft index
// the copy reflects and the bytes written. A short copy is an error.
func (a *Admin) Backup(ctx context.Context, w io.Writer) (uint64, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.scheme+"://"+a.addr+"/v1/cluster/backup", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: cannot reach a raftmeta node at %s: %v", ErrUnavailable, a.addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, 0, decodeAnswer(resp, nil)
	}
	idx, err := strconv.ParseUint(resp.Header.Get("X-Shoal-Backup-Index"), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("%s does not answer like a raftmeta node (no backup index)", a.addr)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return idx, n, fmt.Errorf("backup stream: %w", err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return idx, n, fmt.Errorf("backup stream truncated: %d of %d bytes", n, resp.ContentLength)
	}
	return idx, n, nil
}

// Restore uploads a backup to the node, which must be the leader. The node
// checks the whole file before anything changes; a file it refuses
// (truncated, corrupted, not a catalog, another schema version) is an error
// wrapping ErrInvalidBackup whose message says what is wrong, and the
// catalog is unchanged.
func (a *Admin) Restore(ctx context.Context, r io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.scheme+"://"+a.addr+"/v1/cluster/restore", r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: cannot reach a raftmeta node at %s: %v", ErrUnavailable, a.addr, err)
	}
	defer resp.Body.Close()
	err = decodeAnswer(resp, nil)
	var fe *fsm.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe) && fe.Code == CodeInvalidBackup:
		return fmt.Errorf("%w: %s", ErrInvalidBackup, strings.TrimPrefix(fe.Message, ErrInvalidBackup.Error()+": "))
	case errors.Is(err, errTransport):
		return fmt.Errorf("%s does not answer like a raftmeta node: %w", a.addr, err)
	}
	return err
}
