// Package objecthost owns SQLite files on one machine: one database = one
// object = one file, with its own durable metadata (database UUID, account,
// state active/deleted, routing generation) in a host-local index.
//
// In the data plane it serves the internal HTTP API the edge forwards D1
// queries to (see docs/objecthost-api.md, mirrored in DESIGN.md), executing
// SQL through objecthost/sqlexec. In the control plane it implements the
// object side of create (init, confirm) and delete. In the background plane
// it heartbeats the catalog in batches, kills orphans of failed creates,
// repairs lost route publications, applies account storage blocks, sweeps
// deleted files after a retention, and emits usage, size and route events
// through small sink interfaces.
package objecthost
