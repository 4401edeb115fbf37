#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# pycni onto the node as an admin would: `pycni install` into /opt/cni/bin and /etc/cni/net.d.
# --force replaces same-named plugins a runtime package shipped (CRI-O's bundle puts the reference
# bridge etc. in /opt/cni/bin), keeping them as backups that `pycni uninstall` restores.
# --cni-version 1.0.0: Debian 12's containerd 1.6 speaks spec versions up to 1.0.0.
. "$(dirname "$0")/lib.sh"
log "pycni install"
pycni install --bin-dir "$BIN_DIR" --conf-dir "$CONF_DIR" --conflist "$CONFLIST" \
  --cni-version 1.0.0 --force
log "pycni doctor"
pycni doctor --bin-dir "$BIN_DIR" --conf-dir "$CONF_DIR"
# Runtimes load the first conflist by name (CRI-O: unless cni_default_network names one).
# (`|| continue`, not `&&`: an unmatched last glob must not make the loop, and under pipefail
# the check, fail.)
first=$(for f in "$CONF_DIR"/*.conf "$CONF_DIR"/*.conflist "$CONF_DIR"/*.json; do
  [ -e "$f" ] || continue
  echo "${f##*/}"
done | sort | head -n1)
[ "$first" = "$CONFLIST" ] || echo "note: another conflist ($first) sorts before $CONFLIST"
