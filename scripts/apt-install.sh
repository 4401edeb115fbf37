#!/usr/bin/env bash
# Usage: scripts/apt-install.sh PKG...: apt-get installs those of PKG that are not installed yet
# (without recommends), and prints them; a machine that has them all needs no mirror. As root.
set -euo pipefail
want=()
for p in "$@"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || want+=("$p")
done
[ "${#want[@]}" -gt 0 ] || exit 0
echo "apt-get install ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
