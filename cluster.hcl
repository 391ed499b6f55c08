# cluster.hcl — the Shoal cluster definition.
#
# This example is a 3-node cluster on one machine (loopback): every node runs
# a catalog voter (raftmeta), an edge and an object host. Start it with
#
#   shoal raftmeta serve --config cluster.hcl --node n1 --bootstrap
#   shoal raftmeta serve --config cluster.hcl --node n2
#   shoal raftmeta serve --config cluster.hcl --node n3
#
# (see docs/operations.md). Check it with `shoal config validate cluster.hcl`.

name   = "local"
region = "weur" # default region for nodes that name none: wnam enam weur eeur apac oc

# Mutual TLS between every component (docs/operations.md, "Authentication
# between components"): the cluster CA and one certificate per node, made with
#
#   shoal cluster ca init --dir .shoal/cluster/ca
#   shoal cluster cert issue --ca-dir .shoal/cluster/ca --node n1 --roles catalog,edge,host,pipeline,limiter --out .shoal/cluster/pki
#   (n2, n3 with their roles; an operator's: --node ops --roles operator)
#
# Without a tls block the file is refused, unless `insecure = true` (then
# every internal endpoint answers anyone who can reach it).
tls {
  ca_file  = ".shoal/cluster/pki/ca.crt"
  cert_dir = ".shoal/cluster/pki" # node ID's certificate and key: ID.crt, ID.key
}

catalog {
  max_stale          = "5s"   # stale reads refused past this since the last leader contact
  cache_ttl          = "2s"   # client-side cache of stale reads, keyed per account
  snapshot_threshold = 8192   # log entries between snapshots
  snapshot_interval  = "30s"
  log_store          = "wal"  # Raft log for new data dirs: "wal" (raft-wal, default, one fsync per batch) or "bolt" (raft-boltdb/v2)
}

node "n1" {
  roles           = ["raftmeta", "edge", "objecthost", "pipeline", "limiter"]
  region          = "weur"
  data_dir        = ".shoal/cluster/n1"
  raft_addr       = "127.0.0.1:7001" # Raft TCP transport
  catalog_addr    = "127.0.0.1:7101" # catalog internal HTTP API (forwarding, reads, cluster ops)
  edge_addr       = "127.0.0.1:8787" # public D1-compatible API
  edge_debug_addr = "127.0.0.1:7601" # optional: the edge's /debug/pprof (operators, mutual TLS); other roles serve it on their internal address
  objecthost_addr = "127.0.0.1:7201" # object host internal API
  pipeline_addr   = "127.0.0.1:7401" # pipeline role: /metrics, /healthz, /v1/status (shoal pipeline status)
  limiter_addr    = "127.0.0.1:7501" # limiter role: /metrics, /healthz, /v1/status
}

node "n2" {
  roles           = ["raftmeta", "edge", "objecthost"]
  region          = "weur"
  data_dir        = ".shoal/cluster/n2"
  raft_addr       = "127.0.0.1:7002"
  catalog_addr    = "127.0.0.1:7102"
  edge_addr       = "127.0.0.1:8788"
  objecthost_addr = "127.0.0.1:7202"
}

node "n3" {
  roles           = ["raftmeta", "objecthost"]
  region          = "enam"
  jurisdiction    = "us" # databases created with jurisdiction = "us" land here
  data_dir        = ".shoal/cluster/n3"
  raft_addr       = "127.0.0.1:7003"
  catalog_addr    = "127.0.0.1:7103"
  objecthost_addr = "127.0.0.1:7203"
}

# A non-voting read follower: serves stale reads, never votes.
# node "r1" {
#   roles        = ["raftmeta"]
#   voter        = false
#   raft_addr    = "127.0.0.1:7004"
#   catalog_addr = "127.0.0.1:7104"
# }

# The background plane's brokers. Object hosts publish usage, sizes and
# routes here; the pipeline role consumes; edges read the route feed.
kafka {
  embedded = true                # the pipeline role runs an in-process Kafka-protocol broker (one node, dev only)
  brokers  = ["127.0.0.1:7301"]  # production: your brokers, embedded = false
  # sasl_mechanism     = "scram-sha-512"   # plain, scram-sha-256, scram-sha-512
  # sasl_user          = "shoal"
  # sasl_password_file = "/etc/shoal/kafka-password"
  # tls                = true
  # tls_ca_file        = "/etc/shoal/kafka-ca.pem"
}

clickhouse {
  managed = true             # the pipeline role runs a local clickhouse-server child process
  addr    = "127.0.0.1:7310" # its native port (HTTP on 7311)
  # production: managed = false, dsn = "clickhouse://user:password@host:9000/shoal"
}

# History: object hosts capture every commit's pages and ship them to an
# archive (time travel, restores; objecthost/history/DESIGN.md). Without this
# block history is off (`shoal dev` archives into DIR/archive by itself).
# archive {
#   dir = "/var/lib/shoal-archive"       # a directory outside every data_dir, or:
#   endpoint        = "s3.example.com:443"
#   bucket          = "shoal-archive"
#   prefix          = "prod/"
#   region          = "us-east-1"
#   access_key      = "AKIA…"
#   secret_key_file = "/etc/shoal/archive-secret"   # or $SHOAL_ARCHIVE_SECRET_KEY
#   # tls = true; path_style = true for most self-hosted S3 servers
#   durability = "default"   # or "archived": a write is acknowledged once its commit is in the bucket
#   max_lag    = "1s"        # default: shipped within 1 s
#   alarm_lag  = "10s"       # the lag alarm (GET /v1/history/status, shoal_history_* metrics)
#   deleted_archive_mass_floor = 50      # brake on deleting deleted databases' archives (docs/operations.md)
#   bucket_sweep_interval      = "24h"   # whole-archive pass for deleted databases no host remembers; "off" disables
#   scrub_interval             = "24h"   # each host reads back its databases' archives once per interval, paced; "off" disables
#   scrub_sample               = 1       # objects read in full per database per pass (-1: all)
# }

# The limiter: free-tier daily row limits (tier "free" below), one notice per
# account and UTC day. Run `shoal limiter serve` on one or more nodes; one acts.
limiter {
  interval = "10s"
  # smtp_addr           = "smtp.example.com:587"
  # smtp_from           = "limits@example.com"
  # smtp_to             = "{account_name}"        # template: {account_id}, {account_name}
  # smtp_user           = "shoal"
  # smtp_password_file  = "/etc/shoal/smtp-password"
  # smtp_starttls       = true
  # webhook_url         = "https://billing.example.com/shoal/limits"
  # webhook_secret_file = "/etc/shoal/webhook-secret"  # X-Shoal-Signature: sha256=HMAC(body)
}

# Tier defaults are D1's published limits; override any field here.
tier "free" {
  max_databases        = 10
  max_storage_bytes    = 5368709120 # 5 GB per account
  max_database_bytes   = 524288000  # 500 MB per database
  rows_read_per_day    = 5000000
  rows_written_per_day = 100000
}

tier "paid" {
  max_databases      = 50000
  max_storage_bytes  = 1099511627776 # 1 TB
  max_database_bytes = 10737418240   # 10 GB
}

secrets {
  admin_token = "env:SHOAL_ADMIN_TOKEN" # "env:NAME" reads the environment
  binding_key = "env:SHOAL_BINDING_KEY"
}
