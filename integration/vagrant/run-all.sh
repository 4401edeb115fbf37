#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The whole node scenario, in order: install pycni, cnitool, containerd (CRI) + crictl, CRI-O +
# crictl, then `pycni uninstall` (restoring what --force replaced). Run as root after
# provision.sh; on the VM: `vagrant up` runs it, or `vagrant ssh -c 'sudo /pycni/integration/vagrant/run-all.sh'`.
here=$(dirname "$0")
. "$here/lib.sh"
"$here/install-pycni.sh"
"$here/cnitool.sh"
"$here/containerd.sh"
"$here/crio.sh"
log "pycni uninstall"
pycni uninstall --bin-dir "$BIN_DIR"
log "all scenarios passed"
