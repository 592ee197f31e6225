#!/usr/bin/env bash
# Prints the path of a Prometheus 2.x binary for the tests of deploy/prometheus/:
#   scripts/promtool.sh             promtool   (config, rules and query checks; GPUQ_PROMTOOL)
#   scripts/promtool.sh prometheus  the server (a real scrape of a worker and the exporter;
#                                   GPUQ_PROMETHEUS)
# `make test` exports both. Where it looks:
#   1. $GPUQ_PROMTOOL / $GPUQ_PROMETHEUS, if it names an executable;
#   2. the binary on PATH;
#   3. the one extracted earlier into .cache/promtool/;
#   4. else Debian's (or Ubuntu's) prometheus package: `apt-get download` fetches the .deb into a
#      temporary folder and `dpkg -x` unpacks it there; only the two binaries are kept, in
#      .cache/promtool/. Nothing is installed, so no service is registered or started, and
#      no root is needed.
# Exits 1 with one line on stderr when none of these works.
set -euo pipefail

tool="${1:-promtool}"
case "$tool" in
    promtool) override="${GPUQ_PROMTOOL:-}" ;;
    prometheus) override="${GPUQ_PROMETHEUS:-}" ;;
    *) echo "promtool.sh: unknown tool $tool (promtool or prometheus)" >&2; exit 1 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.cache/promtool"
cached="$cache/$tool"

fail() {
    echo "promtool.sh: $*; install $tool (Prometheus 2.x) or set GPUQ_${tool^^} to one" >&2
    exit 1
}

works() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

if [ -n "$override" ] && works "$override"; then
    echo "$override"
    exit 0
fi
if found="$(command -v "$tool" 2>/dev/null)" && works "$found"; then
    echo "$found"
    exit 0
fi
if works "$cached"; then
    echo "$cached"
    exit 0
fi

command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 \
    || fail "no $tool on PATH, and no apt-get and dpkg to fetch Debian's prometheus package"

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
mkdir -p "$cache"
for name in promtool prometheus; do
    works "$tmp/x/usr/bin/$name" || fail "the prometheus package's usr/bin/$name does not run here"
    # copy, then rename: a concurrent run never sees half a binary
    cp "$tmp/x/usr/bin/$name" "$cache/$name.partial.$$"
    mv -f "$cache/$name.partial.$$" "$cache/$name"
done
echo "$(basename "$deb")" >"$cache/SOURCE"
echo "$cached"
