// Package edge is Shoal's public HTTP API: the data-plane and control-plane
// entry point users talk to, wire-compatible with Cloudflare's D1 REST API
// (/client/v4/accounts/{account_id}/d1/database/...) so existing D1 clients work
// by changing the base URL.
//
// The edge authenticates (bearer tokens, cached locally), rate-limits per
// account and per database, validates every request before doing any work,
// resolves the database's route from a local bbolt cache (falling back to a
// bounded follower read of the catalog on a miss) and forwards queries to the
// object host that owns the database. Binding tokens (package
// internal/binding) carry the route themselves and skip the lookup.
//
// The catalog (package raftmeta) is never on the query path of an existing
// database whose route is cached: with every catalog node down, queries keep
// working. The create, delete, list and info flows do use the catalog; see
// DESIGN.md for the flows and their checkpoints.
//
// Beside D1's endpoints it answers what D1's clients ask around them: the
// identity calls (/memberships, /accounts, /user, tokens/verify; identity.go)
// and the two D1 datasets of the GraphQL Analytics API (/graphql;
// graphql.go), read from the usage pipeline through InsightsSource and
// UsageAnalytics.
package edge
