// Package limiter owns the daily row limits of the free tier (the
// "Limiter" of issue 11): every Interval it asks ClickHouse for today's
// (UTC) rows read and written per account over the tier thresholds, checks
// each candidate's tier and limits in the catalog, publishes a limited flag
// on the compacted `limits` topic that expires at the end of the UTC day,
// notifies the account once per day through pluggable notifiers (SMTP, an
// HTTP webhook), and clears the flag when an `accounts` event says the
// account left the free tier.
//
// It sits on the background plane: it reads ClickHouse
// (pipeline/chsink) and the catalog (raftmeta), and writes Kafka
// (pipeline/event records). Object hosts enforce the flag; nothing here is
// on the query path. Several limiters may run: the one owning partition 0
// of `accounts` in the consumer group acts, and the catalog's
// claim_limit_notice command makes the once-per-day notice hold even when
// two believe they lead. DESIGN.md has the flows and the failure cases.
package limiter
