#!/usr/bin/env bash
# Prints the path of a promtool binary, for the tests that check deploy/prometheus/
# (tests/integration/test_deploy.py; `make test` exports it as GPUQ_PROMTOOL).
#
#   1. $GPUQ_PROMTOOL, if it names an executable;
#   2. promtool on PATH;
#   3. the one extracted earlier into .cache/promtool/;
#   4. else Debian's (or Ubuntu's) prometheus package: `apt-get download` fetches the .deb into a
#      temporary folder and `dpkg -x` unpacks it there; only promtool is kept, in
#      .cache/promtool/. Nothing is installed, so no service is registered or started, and
#      no root is needed.
# Exits 1 with one line on stderr when none of these works.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.cache/promtool"
cached="$cache/promtool"

fail() {
    echo "promtool.sh: $*; install promtool (Prometheus 2.x) or set GPUQ_PROMTOOL to one" >&2
    exit 1
}

works() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

if [ -n "${GPUQ_PROMTOOL:-}" ] && works "$GPUQ_PROMTOOL"; then
    echo "$GPUQ_PROMTOOL"
    exit 0
fi
if found="$(command -v promtool 2>/dev/null)" && works "$found"; then
    echo "$found"
    exit 0
fi
if works "$cached"; then
    echo "$cached"
    exit 0
fi

command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 \
    || fail "no promtool on PATH, and no apt-get and dpkg to fetch Debian's prometheus package"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# (run as root, apt warns that _apt cannot write this private folder and downloads as root)
if ! (cd "$tmp" && apt-get download -q prometheus) >"$tmp/apt.log" 2>&1; then
    why="$(grep -m 1 '^E:' "$tmp/apt.log" || tail -n 1 "$tmp/apt.log")"
    fail "apt-get download prometheus failed ($why; if the package is unknown, apt-get update may help)"
fi
deb="$(ls "$tmp"/prometheus_*.deb 2>/dev/null | head -n 1)"
[ -n "$deb" ] || fail "apt-get download prometheus left no .deb"
dpkg -x "$deb" "$tmp/x" || fail "dpkg -x $deb failed"
works "$tmp/x/usr/bin/promtool" || fail "the prometheus package's usr/bin/promtool does not run here"

mkdir -p "$cache"
# copy, then rename: a concurrent run never sees half a binary
cp "$tmp/x/usr/bin/promtool" "$cached.partial.$$"
mv -f "$cached.partial.$$" "$cached"
echo "$(basename "$deb")" >"$cache/SOURCE"
echo "$cached"
