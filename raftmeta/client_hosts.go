package raftmeta

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// HostRecovery is what lost-host recovery (edge/relocate.go, `shoal
// cluster host lost`) needs of the catalog beyond CatalogReader's Hosts:
// an operator's host state, the databases on a host, and the relocation
// checkpoint.
//
// Contract: safe for concurrent use. SetHostState and RelocateDatabase are
// writes (CatalogWriter's contract: a nil error is committed by a quorum;
// refusals are fsm's sentinels, final); HostDatabasesPage is a keyset page
// read at o's consistency (StorageReader's paging contract, by UUID).
type HostRecovery interface {
	SetHostState(ctx context.Context, s fsm.SetHostState) (fsm.Host, error)
	RelocateDatabase(ctx context.Context, r fsm.RelocateDatabase) (fsm.Database, error)
	HostDatabasesPage(ctx context.Context, hostID, after string, limit int, o ReadOptions) (fsm.HostDatabasesPage, error)
}

var _ HostRecovery = (*Client)(nil)

// SetHostState sets a host's state (fsm.CmdSetHostState).
func (c *Client) SetHostState(ctx context.Context, s fsm.SetHostState) (fsm.Host, error) {
	out, err := apply[fsm.Host](ctx, c, fsm.CmdSetHostState, s)
	if c.cache != nil {
		c.cache.invalidate("hosts")
	}
	return out, err
}

// RelocateDatabase moves a database to a new object (fsm.CmdRelocateDatabase).
func (c *Client) RelocateDatabase(ctx context.Context, r fsm.RelocateDatabase) (fsm.Database, error) {
	out, err := apply[fsm.Database](ctx, c, fsm.CmdRelocateDatabase, r)
	c.invalidate(out.AccountID, r.UUID, out.Name)
	return out, err
}

// HostDatabasesPage reads one page of the active databases on a host.
func (c *Client) HostDatabasesPage(ctx context.Context, hostID, after string, limit int, o ReadOptions) (fsm.HostDatabasesPage, error) {
	var out fsm.HostDatabasesPage
	err := c.read(ctx, "", http.MethodGet, "/v1/hosts/"+url.PathEscape(hostID)+"/databases", storagePageQuery(after, limit), nil, o, &out)
	return out, err
}

// AuditPage reads a page of the audit log (fsm.AuditQuery), never cached.
func (c *Client) AuditPage(ctx context.Context, q fsm.AuditQuery, o ReadOptions) (fsm.AuditPage, error) {
	v := url.Values{}
	if q.AccountID != "" {
		v.Set("account", q.AccountID)
	}
	if q.Before > 0 {
		v.Set("before", strconv.FormatInt(q.Before, 10))
	}
	if q.Since > 0 {
		v.Set("since", strconv.FormatInt(q.Since, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	o.NoCache = true
	var out fsm.AuditPage
	err := c.read(ctx, "", http.MethodGet, "/v1/audit", v, nil, o, &out)
	return out, err
}

// RecordAudit records an action done outside the catalog (a time-travel
// restore on a host) in the audit log; who and from where come from ctx
// (fsm.WithAudit).
func (c *Client) RecordAudit(ctx context.Context, a fsm.RecordAudit) error {
	_, err := apply[struct{}](ctx, c, fsm.CmdRecordAudit, a)
	return err
}
