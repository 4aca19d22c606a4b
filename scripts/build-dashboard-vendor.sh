#!/usr/bin/env bash
# Vendor the uPlot chart library into the monitoring dashboard (a build product, git-ignored).
#
#   scripts/build-dashboard-vendor.sh          # idempotent: nothing to do when vendor/VERSION matches
#
# Output: roles/monitoring/files/dashboard/vendor/{uPlot.iife.min.js,uPlot.min.css,LICENSE,VERSION}
#
# The tarball comes from `npm pack`, so npm's own configuration (~/.npmrc, /etc/npmrc,
# npm_config_registry) decides where it is fetched from; no registry is named here.
# Its sha512 is computed locally and must equal UPLOT_INTEGRITY below, else the script fails
# and leaves the vendor directory untouched.
#
# Bumping the version:
#   1. npm view uplot@NEW dist.integrity          # prints sha512-...
#   2. set UPLOT_VERSION and UPLOT_INTEGRITY below to NEW and that value
#   3. run this script, then the browser test:
#        .venv/bin/python -m pytest tests/integration/test_dashboard_browser.py -q
#      (check the screenshot in .cache/artifacts/dashboard-integration.png; uPlot's options
#      API changes rarely, but read its changelog for anything the dashboard.js uses)
set -euo pipefail

UPLOT_VERSION="1.6.32"
UPLOT_INTEGRITY="sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENDOR="$ROOT/roles/monitoring/files/dashboard/vendor"
FILES=(uPlot.iife.min.js uPlot.min.css LICENSE)
STAMP="uplot@$UPLOT_VERSION $UPLOT_INTEGRITY"

die() { echo "build-dashboard-vendor: ERROR: $*" >&2; exit 1; }

up_to_date() {
  [ -f "$VENDOR/VERSION" ] && [ "$(cat "$VENDOR/VERSION")" = "$STAMP" ] || return 1
  local f
  for f in "${FILES[@]}"; do [ -s "$VENDOR/$f" ] || return 1; done
}

if up_to_date; then
  echo "build-dashboard-vendor: uplot@$UPLOT_VERSION already vendored"
  exit 0
fi

command -v npm >/dev/null || die "npm is not installed (apt-get install npm)"
command -v node >/dev/null || die "node is not installed (apt-get install nodejs)"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

echo "build-dashboard-vendor: fetching uplot@$UPLOT_VERSION with npm pack"
(cd "$TMP" && npm pack "uplot@$UPLOT_VERSION" --json --silent >pack.json) \
  || die "npm pack uplot@$UPLOT_VERSION failed"

TARBALL="$(node -e '
  const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const p = Array.isArray(r) ? r[0] : r;
  if (!p || !p.filename) process.exit(1);
  process.stdout.write(p.filename);' "$TMP/pack.json")" || die "npm pack printed no filename"
[ -f "$TMP/$TARBALL" ] || die "npm pack did not write $TARBALL"

# Hash the bytes ourselves: npm's reported integrity is only what npm believes.
ACTUAL="sha512-$(node -e '
  const c = require("crypto"), fs = require("fs");
  process.stdout.write(c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"));' \
  "$TMP/$TARBALL")"
if [ "$ACTUAL" != "$UPLOT_INTEGRITY" ]; then
  die "integrity mismatch for uplot@$UPLOT_VERSION
  expected: $UPLOT_INTEGRITY
  actual:   $ACTUAL
Refusing to vendor it. If you are bumping the version, update UPLOT_INTEGRITY (see the header)."
fi

mkdir -p "$TMP/x"
tar -xzf "$TMP/$TARBALL" -C "$TMP/x" package/dist/uPlot.iife.min.js package/dist/uPlot.min.css package/LICENSE \
  || die "the tarball lacks dist/uPlot.iife.min.js, dist/uPlot.min.css or LICENSE"

# Stage next to the target and swap in one go, so a failure never leaves half a vendor dir.
STAGE="$VENDOR.new.$$"
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp "$TMP/x/package/dist/uPlot.iife.min.js" "$TMP/x/package/dist/uPlot.min.css" "$TMP/x/package/LICENSE" "$STAGE/"
chmod 0644 "$STAGE"/*
printf '%s\n' "$STAMP" >"$STAGE/VERSION"
rm -rf "$VENDOR"
mv "$STAGE" "$VENDOR"
echo "build-dashboard-vendor: vendored uplot@$UPLOT_VERSION into ${VENDOR#"$ROOT"/}"
