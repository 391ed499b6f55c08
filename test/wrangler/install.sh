#!/bin/sh
# Installs the D1 clients that wrangler_test.go runs against `shoal dev`,
# pinned by the committed package.json and package-lock.json, into
# test/wrangler/node_modules (git-ignored):
#   wrangler  4.86.0   (the newest 4.x that runs on Node 20)
#   wrangler3 3.114.17 (npm alias of wrangler@3.114.17)
#   cloudflare 7.3.0   (the TypeScript SDK)
# Idempotent: does nothing when node_modules already holds exactly this
# lock. Needs node >= 20 and npm, and the npm registry (nothing else).
# Install scripts are not run: none of them is needed here (workerd and
# esbuild ship their binaries as packages), and skipping them keeps the
# install the same on every npm version.
set -eu
cd "$(dirname "$0")"

for tool in node npm; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "test/wrangler/install.sh: $tool is not installed (apt-get install -y nodejs npm)" >&2
		exit 1
	fi
done
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'; then
	echo "test/wrangler/install.sh: node $(node --version) is too old: wrangler 4.86 needs node >= 20" >&2
	exit 1
fi

stamp=node_modules/.shoal-lock
if [ -f "$stamp" ] && cmp -s package-lock.json "$stamp" &&
	[ -f node_modules/wrangler/package.json ] && [ -f node_modules/wrangler3/package.json ] &&
	[ -f node_modules/cloudflare/package.json ]; then
	echo "test/wrangler: wrangler 4.86.0, wrangler 3.114.17 and cloudflare 7.3.0 already installed"
	exit 0
fi
npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
cp package-lock.json "$stamp"
echo "test/wrangler: installed $(node -p 'require("./node_modules/wrangler/package.json").version') (wrangler), $(node -p 'require("./node_modules/wrangler3/package.json").version') (wrangler3), $(node -p 'require("./node_modules/cloudflare/package.json").version') (cloudflare)"
