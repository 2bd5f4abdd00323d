#!/usr/bin/env bash
# Creates a Debian root with a newer CPython and Gym's web stack, so tests and
# the bench can run the Pythons Gym runs on this Debian 12 host:
#   make-root.sh trixie  -> /var/tmp/gymtrace-trixie: 3.13, uvloop 0.21 (Gym's pin)
#   make-root.sh sid     -> /var/tmp/gymtrace-sid:    3.14, uvloop 0.23, aiohttp 3.14,
#                           and the OTel Python SDK (Gym's own telemetry, for the bench)
# GYMTRACE_TRIXIE_ROOT / GYMTRACE_SID_ROOT move them. Idempotent: a finished root is
# marked with its package list and left alone; an unfinished one is redone.
# Needs root and the Debian mirror (override with GYMTRACE_DEBIAN_MIRROR).
set -euo pipefail

suite="${1:-}"
web="python3-fastapi,python3-uvicorn,python3-aiohttp,python3-httptools,python3-uvloop,python3-yaml,python3-itsdangerous"
case "$suite" in
trixie)
	root="${GYMTRACE_TRIXIE_ROOT:-/var/tmp/gymtrace-trixie}"
	py=python3.13
	pkgs="python3.13,$web"
	;;
sid)
	root="${GYMTRACE_SID_ROOT:-/var/tmp/gymtrace-sid}"
	py=python3.14
	pkgs="python3.14,$web,python3-opentelemetry-sdk,python3-opentelemetry-exporter-otlp-proto-http"
	;;
*)
	echo "usage: make-root.sh trixie|sid" >&2
	exit 2
	;;
esac
# The archive this machine's apt sources name (scripts/debian-mirror).
mirror=$("$(dirname "${BASH_SOURCE[0]}")/../../scripts/debian-mirror") || exit 1
marker="$root/.gymtrace-ready"
me="make-root.sh $suite"

if [[ -f "$marker" && "$(cat "$marker")" == "$pkgs" && -x "$root/usr/bin/$py" ]]; then
	echo "$suite root ready at $root"
	exit 0
fi
if [[ $EUID -ne 0 ]]; then
	echo "$me: debootstrap needs root; run it as root (or with sudo)" >&2
	exit 1
fi
if ! command -v debootstrap >/dev/null; then
	apt-get install -y debootstrap >/dev/null
fi
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if [[ ! -f /usr/share/keyrings/debian-archive-trixie-stable.gpg ]]; then
	echo "$me: this host's debian-archive-keyring has no trixie key;" \
		"install a newer debian-archive-keyring" >&2
	exit 1
fi

# A half-made root (interrupted debootstrap) is not resumable: start over.
if [[ -e "$root" ]]; then
	echo "removing unfinished $suite root $root"
	rm -rf --one-file-system "$root"
fi
tmp="$root.tmp.$$"
trap 'rm -rf --one-file-system "$tmp" "$tmp.log"' EXIT
echo "debootstrap $suite into $root from $mirror (a minute or two)"
debootstrap --variant=minbase --keyring="$keyring" --include="$pkgs" \
	"$suite" "$tmp" "$mirror" >"$tmp.log" 2>&1 || {
	echo "$me: debootstrap failed; last lines of its log:" >&2
	tail -n 30 "$tmp.log" >&2
	exit 1
}
rm -f "$tmp.log"
# Drop the package cache: the root is only run, never upgraded.
rm -rf "$tmp/var/cache/apt/archives/"*.deb
mv "$tmp" "$root"
trap - EXIT
printf '%s' "$pkgs" >"$marker"
chroot "$root" "/usr/bin/$py" -c "import sys; print('$suite root ready:', sys.version)"
