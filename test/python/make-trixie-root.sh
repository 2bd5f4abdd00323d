#!/usr/bin/env bash
# The Debian 13 root (python3.13, uvloop 0.21): see make-root.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/make-root.sh" trixie
