#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The whole node scenario, in order: install pycni, cnitool, containerd (CRI) + crictl, CRI-O +
# crictl, then `pycni uninstall` (restoring what --force replaced); ends with "all scenarios
# passed". On an offline node (no crictl: provision.sh says so) our CRI client drives both
# runtimes, CRI-O being shared/reference/bin's (crio-binaries.sh); without those binaries either,
# CRI-O is skipped with a line saying so. Run as root after provision.sh; on the
# VM: `vagrant up` runs it, or `vagrant ssh -c 'sudo /pycni/integration/vagrant/run-all.sh'`.
here=$(dirname "$0")
. "$here/lib.sh"
"$here/install-pycni.sh"
"$here/cnitool.sh"
"$here/containerd.sh"
if command -v crio >/dev/null; then
  "$here/crio.sh"
else
  log "skip: CRI-O is not installed (provision.sh found neither its repository nor its binaries)"
fi
log "pycni uninstall"
pycni uninstall --bin-dir "$BIN_DIR"
log "all scenarios passed"
