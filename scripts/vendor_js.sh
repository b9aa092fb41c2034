#!/usr/bin/env bash
# Re-fetch the charting library the HTML report embeds (uPlot, MIT) at a pinned version, check the
# npm tarball against its pinned sha512 integrity, and copy the minified IIFE build, its CSS and
# its LICENSE into reports/static/. The report inlines these files, so opening a report needs no
# network; this script is the only place that touches the npm registry.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="1.6.32"
INTEGRITY="sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
DEST="reports/static"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "uplot@${VERSION}" >/dev/null)
tarball="$work/uplot-${VERSION}.tgz"
actual="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
if [ "$actual" != "$INTEGRITY" ]; then
    echo "vendor_js: uplot-${VERSION}.tgz integrity $actual, expected $INTEGRITY" >&2
    exit 1
fi
tar -xzf "$tarball" -C "$work"
mkdir -p "$DEST"
cp "$work/package/dist/uPlot.iife.min.js" "$DEST/uPlot.iife.min.js"
cp "$work/package/dist/uPlot.min.css" "$DEST/uPlot.min.css"
cp "$work/package/LICENSE" "$DEST/uPlot.LICENSE"
printf 'uplot %s %s\n' "$VERSION" "$INTEGRITY" >"$DEST/VENDORED"
echo "vendored uplot ${VERSION} into ${DEST}/"
