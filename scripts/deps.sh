#!/usr/bin/env bash
# Installs the system packages Shoal's build and tests need, when missing.
# Debian only; runs apt-get as root (or through sudo). Idempotent and quiet
# when everything is present.
set -euo pipefail

need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v git >/dev/null 2>&1 || need+=(git)
command -v curl >/dev/null 2>&1 || need+=(curl ca-certificates) # the README flow test runs the printed curl commands
command -v sqlite3 >/dev/null 2>&1 || need+=(sqlite3) # dump compatibility test against the real shell
# pipeline/chlocal runs it for `shoal dev` analytics and the pipeline tests (Debian: 18.16).
command -v clickhouse-server >/dev/null 2>&1 || { [ -x /usr/sbin/clickhouse-server ] || need+=(clickhouse-server clickhouse-client); }
# test/robustness builds its topology with ip netns, veth and tc (iproute2).
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || need+=(iproute2)
# Its partitions (split brain, one-way) are iptables drops inside the namespaces.
command -v iptables >/dev/null 2>&1 || need+=(iptables)
# Go is never installed from apt: Debian's golang-go (1.19) is older than the
# go line of go.mod. A missing or older go stops here with what to install.
root="$(cd "$(dirname "$0")/.." && pwd)"
want="$(sed -n 's/^go \([0-9][0-9.a-z]*\).*/\1/p' "$root/go.mod" | head -1)"
gobin="$(command -v go 2>/dev/null || { [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go; } || true)"
have=""
if [ -n "$gobin" ]; then
  # As a build would run it: a go >= 1.21 may switch to go.mod's toolchain (GOTOOLCHAIN).
  have="$(cd "$root" && "$gobin" env GOVERSION 2>/dev/null | grep -o 'go[0-9][0-9.a-z]*' | head -1 || true)"
  have="${have#go}"
fi
if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]; then
  found="no go on PATH"
  [ -z "$gobin" ] || found="found $(GOTOOLCHAIN=local "$gobin" version 2>/dev/null | grep -o 'go[0-9][0-9.a-z]*' | head -1 || echo "an unusable go") at $gobin"
  echo "Shoal needs Go >= $want (go.mod), $found: install Go $want or newer from https://go.dev/dl/ (not Debian's golang-go, which is 1.19) and put its bin directory first in PATH" >&2
  exit 1
fi
# make bench: wrk drives the edge and the object host from its own process
# (the benches skip those figures without it).
if [ "${SHOAL_DEPS_BENCH:-}" = 1 ]; then
  command -v wrk >/dev/null 2>&1 || need+=(wrk)
  # test/bench's TestDeployBench runs a 3-member etcd beside Shoal in the
  # same run (Debian's etcd-server 3.4: /usr/bin/etcd).
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
fi

# test/compat (miniflare) and test/wrangler (wrangler 3/4, the TypeScript SDK)
# run real D1 clients in Node (>= 20 for wrangler 4.86; these machines ship it).
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || need+=(nodejs npm)

if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}"
fi

# npm packages, pinned by each folder's package-lock.json; idempotent (a few
# ms when installed, ~30 s the first time).
here="$(cd "$(dirname "$0")" && pwd)"
for suite in compat wrangler; do
  if [ -f "$here/../test/$suite/install.sh" ]; then
    sh "$here/../test/$suite/install.sh" >/dev/null
  fi
done
