#!/usr/bin/env bash
# Creates a Debian 13 (trixie) root with python3.13, FastAPI, uvicorn and aiohttp at
# $GYMTRACE_TRIXIE_ROOT (default /var/tmp/gymtrace-trixie), so tests can run Gym's
# minimum Python (3.13) as shipped by a distribution on this Debian 12 host.
# Idempotent: a finished root is marked and left alone; an unfinished one is redone.
# Needs root and the Debian mirror (apt's configured one; override with
# GYMTRACE_DEBIAN_MIRROR).
set -euo pipefail

root="${GYMTRACE_TRIXIE_ROOT:-/var/tmp/gymtrace-trixie}"
mirror="${GYMTRACE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
pkgs="python3.13,python3-fastapi,python3-uvicorn,python3-aiohttp,python3-httptools,python3-uvloop,python3-yaml,python3-itsdangerous"
marker="$root/.gymtrace-ready"

if [[ -f "$marker" && "$(cat "$marker")" == "$pkgs" && -x "$root/usr/bin/python3.13" ]]; then
	echo "trixie root ready at $root"
	exit 0
fi
if [[ $EUID -ne 0 ]]; then
	echo "make-trixie-root.sh: debootstrap needs root; run it with sudo" >&2
	exit 1
fi
if ! command -v debootstrap >/dev/null; then
	apt-get install -y debootstrap >/dev/null
fi
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if [[ ! -f /usr/share/keyrings/debian-archive-trixie-stable.gpg ]]; then
	echo "make-trixie-root.sh: this host's debian-archive-keyring has no trixie key;" \
		"install a newer debian-archive-keyring" >&2
	exit 1
fi

# A half-made root (interrupted debootstrap) is not resumable: start over.
if [[ -e "$root" ]]; then
	echo "removing unfinished trixie root $root"
	rm -rf --one-file-system "$root"
fi
tmp="$root.tmp.$$"
trap 'rm -rf --one-file-system "$tmp"' EXIT
echo "debootstrap trixie into $root from $mirror (a few minutes)"
debootstrap --variant=minbase --keyring="$keyring" --include="$pkgs" \
	trixie "$tmp" "$mirror" >"$tmp.log" 2>&1 || {
	echo "make-trixie-root.sh: debootstrap failed; last lines of its log:" >&2
	tail -n 30 "$tmp.log" >&2
	rm -f "$tmp.log"
	exit 1
}
rm -f "$tmp.log"
# Drop the package cache: the root is only run, never upgraded.
rm -rf "$tmp/var/cache/apt/archives/"*.deb
mv "$tmp" "$root"
trap - EXIT
printf '%s' "$pkgs" >"$marker"
"$root/usr/bin/python3.13" -c 'import sys; print("trixie root ready:", sys.version)' 2>/dev/null ||
	chroot "$root" /usr/bin/python3.13 -c 'import sys; print("trixie root ready:", sys.version)'
