#!/usr/bin/env bash
# Install the portal's front-end libraries from npm and vendor them into frontend/static/vendor/.
# Re-runnable: it rebuilds the vendor folder from package-lock.json each time. The vendored files are
# committed, so the running app never needs npm or a CDN.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; else npm install --no-audit --no-fund; fi
vendor="$here/static/vendor"
rm -rf "$vendor"
mkdir -p "$vendor/htmx" "$vendor/chartjs"
cp node_modules/htmx.org/dist/htmx.min.js "$vendor/htmx/htmx.min.js"
cp node_modules/htmx.org/LICENSE "$vendor/htmx/LICENSE"
cp node_modules/chart.js/dist/chart.umd.min.js "$vendor/chartjs/chart.umd.min.js"
cp node_modules/chart.js/LICENSE.md "$vendor/chartjs/LICENSE.md"
{
  echo "Vendored by frontend/build_assets.sh from npm; do not edit by hand."
  for pkg in htmx.org chart.js; do
    echo "$pkg $(node -p "require('./node_modules/$pkg/package.json').version")"
  done
} > "$vendor/VERSIONS.txt"
echo "vendored into $vendor:" && cat "$vendor/VERSIONS.txt"
