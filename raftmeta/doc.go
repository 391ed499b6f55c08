// Package raftmeta is Shoal's transactional catalog service: a HashiCorp Raft
// group (raft-wal or raft-boltdb/v2 log and stable store, file snapshots,
// TCP transport) whose state machine is the SQLite catalog of package
// raftmeta/fsm.
//
// It owns the Raft node ([Node]): leader forwarding of writes, the three read
// consistency levels (linearizable, leader, stale with a max-staleness bound),
// non-voting read followers, snapshots, backup and restore, and
// bootstrap/join/remove/status; the internal HTTP API every node serves; and
// the Go [Client] that the other components (edge, objecthost, pipeline,
// limiter) use to reach the catalog. See DESIGN.md for the flows.
package raftmeta
