#!/usr/bin/env bash
# Builds integration/cnitool/cnitool.go into OUT (default build/cnitool) against Debian's libcni,
# offline: golang-go and golang-github-appc-cni-dev from apt, no module proxy. Rebuilds only
# when the source is newer than OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../build/cnitool}
"$here/../../scripts/apt-install.sh" golang-go golang-github-appc-cni-dev >/dev/null
if [ -x "$out" ] && [ "$out" -nt "$here/cnitool.go" ]; then
  exit 0
fi
mkdir -p "$(dirname "$out")"
GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=${GOCACHE:-/tmp/pycni-gocache} \
  go build -o "$out" "$here/cnitool.go"
