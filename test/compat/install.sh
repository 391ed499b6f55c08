#!/bin/sh
# Installs D1's local implementation for the differential compatibility suite
# (TestD1Compat): miniflare 4.20260426.0, the version wrangler 4.86.0 runs,
# with its workerd binary, pinned by package-lock.json, into
# test/compat/node_modules. Idempotent: does nothing when that exact
# version is already installed. Needs node (>= 18; Debian's nodejs works)
# and npm.
set -eu
cd "$(dirname "$0")"
want=$(node -p 'require("./package.json").dependencies.miniflare')
have=$(node -p 'try { require("./node_modules/miniflare/package.json").version } catch (e) { "" }')
if [ "$have" = "$want" ] && node_modules/.bin/workerd --version >/dev/null 2>&1; then
	echo "test/compat: miniflare $have already installed"
	exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "test/compat: installed miniflare $(node -p 'require("./node_modules/miniflare/package.json").version')"
