package raftmeta

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// TestAuditLog: control-plane commands proposed with an audit context leave
// one row each, in the same transaction (a refused command none), with who
// and from where; a membership change is recorded by the node; pages go
// newest first, by account; prune_audit removes old rows.
func TestAuditLog(t *testing.T) {
	ctx := context.Background()
	tc := newTestCluster(t, 3, nil)
	leader := tc.waitLeader()
	// The level raise's own audit row first, so that the newest-row and
	// pruning checks below see only what this test wrote.
	waitLevelRaised(t, leader)
	c, err := NewClient(tc.addrs(), WithCacheTTL(0))
	require.NoError(t, err)
	defer c.Close()
	actx := fsm.WithAudit(ctx, fsm.Audit{Actor: "token:t-admin", Source: "203.0.113.7:5555"})

	_, err = c.CreateAccount(actx, newAccount("a1", 10))
	require.NoError(t, err)
	_, err = c.CreateAccount(actx, newAccount("a1", 10))
	require.ErrorIs(t, err, fsm.ErrExists)
	_, err = c.RegisterHost(ctx, fsm.RegisterHost{ID: "h1", Address: "127.0.0.1:1", State: fsm.HostStateActive})
	require.NoError(t, err)
	d, err := c.CreateDatabase(actx, newDB("a1"))
	require.NoError(t, err)
	_, err = c.CreateToken(actx, fsm.CreateToken{ID: "t1", AccountID: "a1", Hash: "00000000000000000000000000000000000000000000000000000000000000aa",
		Name: "ci", Scope: fsm.ScopeRead, Databases: []string{d.UUID}})
	require.NoError(t, err)
	_, err = c.DeleteDatabase(actx, "a1", d.UUID)
	require.NoError(t, err)
	tier := fsm.TierPaid
	_, err = c.UpdateAccount(actx, fsm.UpdateAccount{ID: "a1", Tier: &tier})
	require.NoError(t, err)

	page, err := c.AuditPage(ctx, fsm.AuditQuery{AccountID: "a1"}, LinearizableRead())
	require.NoError(t, err)
	var types []string
	for _, e := range page.Entries {
		types = append(types, e.Type)
		assert.Equal(t, "token:t-admin", e.Actor)
		assert.Equal(t, "203.0.113.7:5555", e.Source)
		assert.Equal(t, "a1", e.AccountID)
	}
	assert.Equal(t, []string{"update_account", "delete_database", "create_token", "create_database", "create_account"}, types,
		"newest first; the refused create_account left nothing")
	assert.Contains(t, page.Entries[2].Detail, `"scope":"read"`)
	assert.NotContains(t, page.Entries[2].Detail, "00000000000000000000000000000000000000000000000000000000000000aa", "never the token's hash")

	// Paging.
	p1, err := c.AuditPage(ctx, fsm.AuditQuery{AccountID: "a1", Limit: 2}, LinearizableRead())
	require.NoError(t, err)
	require.Len(t, p1.Entries, 2)
	p2, err := c.AuditPage(ctx, fsm.AuditQuery{AccountID: "a1", Limit: 10, Before: p1.Next}, LinearizableRead())
	require.NoError(t, err)
	assert.Len(t, p2.Entries, 3)
	assert.Zero(t, p2.Next)

	// A membership change through the HTTP API is recorded by the node.
	require.NoError(t, NewAdmin(leader.HTTPAddr(), 10*time.Second).Remove(ctx, tc.follower().cfg.ID))
	require.Eventually(t, func() bool {
		all, err := c.AuditPage(ctx, fsm.AuditQuery{Limit: 1}, LinearizableRead())
		return err == nil && len(all.Entries) == 1 && all.Entries[0].Type == "record_audit" && all.Entries[0].Subject != ""
	}, 10*time.Second, 50*time.Millisecond)

	// Pruning.
	cmd, err := fsm.NewCommand(fsm.CmdPruneAudit, "prune-1", time.Now().UnixNano(), fsm.PruneAudit{Before: time.Now().Add(time.Hour).UnixNano()})
	require.NoError(t, err)
	_, err = leader.Apply(ctx, cmd)
	require.NoError(t, err)
	all, err := c.AuditPage(ctx, fsm.AuditQuery{}, LinearizableRead())
	require.NoError(t, err)
	assert.Empty(t, all.Entries)
}
