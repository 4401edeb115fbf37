#!/usr/bin/env bash
# Builds integration/cnitool/cnitool.go into OUT (default build/cnitool) against Debian's libcni,
# offline: golang-go and golang-github-appc-cni-dev from apt, no module proxy. Rebuilds only
# when the source is newer than OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../build/cnitool}
want=""
for p in golang-go golang-github-appc-cni-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || want="$want $p"
done
if [ -n "$want" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $want >/dev/null
fi
if [ -x "$out" ] && [ "$out" -nt "$here/cnitool.go" ]; then
  exit 0
fi
mkdir -p "$(dirname "$out")"
GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=${GOCACHE:-/tmp/pycni-gocache} \
  go build -o "$out" "$here/cnitool.go"
