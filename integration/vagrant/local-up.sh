#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# `make vagrant-test`: the Vagrantfile, offline, with the local box of `make vagrant-box`:
# `vagrant up --provider libvirt` provisions the VM and runs the node scenario to "all scenarios
# passed", then `vagrant destroy`. As root, on a Debian 12 host.
#
# libvirtd, its NAT network (a bridge, dnsmasq, firewall rules), the VM and vagrant run in
# private network, mount and PID namespaces: nothing touches the host's interfaces, routes or
# firewall; /run is a private tmpfs and the libvirt dirs are bind mounts of build/vagrant/ns
# (config, storage pool, logs); whatever is still running when the script ends dies with its PID
# namespace. The VM reaches nothing beyond that bridge, so the run is offline whatever the host
# can reach.
#
#   integration/vagrant/local-up.sh           # box (if needed), up, scenario, destroy
#   integration/vagrant/local-up.sh --shell   # the same, with a shell in the namespace before
#                                             # the destroy (vagrant ssh, virsh)
# The log: build/vagrant/up.log; libvirt's: build/vagrant/ns/log.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/build/vagrant
NS=$OUT/ns
LOG=$OUT/up.log
export PYCNI_BOX=${PYCNI_BOX:-pycni/bookworm64}
# This machine's state stays apart from that of a `vagrant up` in the same checkout.
export VAGRANT_DOTFILE_PATH=$OUT/dotfile
HOST_PACKAGES="vagrant vagrant-libvirt libvirt-daemon-system dnsmasq-base rsync qemu-system-x86"

if [ "${1:-}" != --inside ]; then
  [ "$(id -u)" = 0 ] || { echo "make vagrant-test: run as root"; exit 2; }
  # (on a systemd host libvirt's package starts a libvirtd of the host's own: not used here)
  # shellcheck disable=SC2086
  "$ROOT/scripts/apt-install.sh" $HOST_PACKAGES | sed 's/^/vagrant-test: /'
  "${PYTHON:-$ROOT/.venv/bin/python}" "$ROOT/integration/vm/vm.py" --box
  mkdir -p "$OUT"
  set +e
  unshare --net --mount --pid --fork --mount-proc --propagation private -- "$0" --inside "$@"
  rc=$?
  set -e
  # PID 1 of the namespace has exited: the kernel has killed whatever was left in it, and the
  # network namespace (bridge, dnsmasq's leases, firewall rules) went with its last process.
  echo "vagrant-test: namespaces gone; log $LOG"
  exit "$rc"
fi

# --- inside: PID 1 of a new PID namespace, in a new network and mount namespace ---------------
. "$ROOT/integration/vagrant/lib.sh"
shell=""
[ "${2:-}" = --shell ] && shell=1
libvirtd_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  cd "$ROOT"
  [ -z "$libvirtd_pid" ] || {
    log "vagrant destroy"
    vagrant destroy -f < /dev/null 2>&1 | tee -a "$LOG" || true
    # networks first: that stops their dnsmasq
    for net in $(virsh net-list --name 2>/dev/null); do virsh net-destroy "$net" >/dev/null || true; done
    for dom in $(virsh list --name 2>/dev/null); do virsh destroy "$dom" >/dev/null || true; done
    kill "$libvirtd_pid" 2>/dev/null || true
    wait "$libvirtd_pid" 2>/dev/null || true
  }
  rm -rf "$NS/lib/images"  # the box's volume: a copy of the box's disk, 1-2 GB
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip link set lo up
rm -rf "$NS"
mkdir -p "$NS/lib/images" "$NS/log" "$NS/cache"
cp -a /etc/libvirt "$NS/etc"
# vagrant-libvirt makes its own network; libvirt's default one is not wanted here
rm -f "$NS"/etc/qemu/networks/autostart/*.xml
cat >> "$NS/etc/qemu.conf" <<'CONF'

# make vagrant-test (integration/vagrant/local-up.sh): a libvirtd in private namespaces, as root,
# no cgroups (no systemd as PID 1), no virtlogd, no relabelling of the box's kernel and disk.
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
stdio_handler = "file"
CONF
cat >> "$NS/etc/libvirtd.conf" <<'CONF'

# make vagrant-test: root only (the socket is in a private /run), no polkit
auth_unix_rw = "none"
CONF
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/lock
mount --bind "$NS/etc" /etc/libvirt
mount --bind "$NS/lib" /var/lib/libvirt
mount --bind "$NS/log" /var/log/libvirt
mount --bind "$NS/cache" /var/cache/libvirt

log "libvirtd (private namespaces; state in ${NS#"$ROOT"/})"
libvirtd > "$NS/log/libvirtd.out" 2>&1 &
libvirtd_pid=$!
wait_until 60 "libvirtd" virsh -c qemu:///system version
virsh pool-define-as default dir --target /var/lib/libvirt/images >/dev/null
virsh pool-start default >/dev/null

cd "$ROOT"
log "PYCNI_BOX=$PYCNI_BOX vagrant --no-tty up --provider libvirt"
start=$SECONDS
rc=0
# --no-tty: no progress bars (a 1.4 GB upload draws thousands) in the log
vagrant --no-tty up --provider libvirt < /dev/null 2>&1 | tee "$LOG" || rc=$?
took=$((SECONDS - start))
if [ -n "$shell" ]; then
  log "a shell in the namespace (vagrant ssh, virsh list); exit to destroy"
  bash -i || true
fi
grep -q "all scenarios passed" "$LOG" || rc=1
if [ "$rc" = 0 ]; then
  log "vagrant-test: passed: vagrant up ran the scenario to 'all scenarios passed' in ${took}s"
else
  log "vagrant-test: FAILED (vagrant up exit $rc after ${took}s)"
fi
exit "$rc"
