#!/usr/bin/env bash
# One step of `make vm-test`, run as root inside the VM (integration/vm/vm.py calls it over ssh):
#   guest.sh setup|install|cnitool|cri|daemonset|crio|vlan|pods-before-reboot|after-reboot|uninstall
# The node is a real one: systemd as PID 1, pycni installed as the README tells a user (its wheel
# into a venv of its own, /opt/pycni-venv, then `pycni install` into /opt/cni/bin and
# /etc/cni/net.d with its socket unit), cnitool built from Debian's libcni, containerd and CRI-O
# (1.33.5, shared/reference/bin's) as runtimes. The checkout (/opt/pycni) holds the test scripts
# and the test tools' venv (.venv), never the pycni the node runs. Exits non-zero with a FAIL line.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail  # (so no `grep -q` after a pipe: its early exit would fail the writer)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PYCNI_VENV=/opt/pycni-venv  # lib.sh's pycni: the wheel's
WHEELHOUSE=/opt/wheelhouse
. "$ROOT/integration/vagrant/lib.sh"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CNITOOL=/usr/local/bin/cnitool
STATE=/var/lib/pycni-vm  # what the reboot step compares, on disk: survives the reboot

unit_state() { systemctl is-active "$1" 2>/dev/null || true; }
service_active() { [ "$(unit_state pycni.service)" = active ]; }
elapsed() { awk "BEGIN { printf \"%.2f\", $EPOCHREALTIME - $1 }"; }
# The dead pods' host-local reservations and libcni cache entries (on disk, survive reboots).
reservations() { ls "/var/lib/cni/networks/$NETWORK" | grep -v -e '^lock$' -e '^last_reserved_ip' || true; }
cached() { ls /var/lib/cni/results | grep "^$NETWORK-cnitool-" || true; }
# Requests the daemon says it answered (its own count, through `pycni doctor`'s status query):
# the plugins fall back to running in-process when no daemon takes a request, so a pod that
# worked does not show the daemon served it.
daemon_answered() {
  local out n
  out=$(pycni doctor 2>&1 || true)
  n=$(sed -n 's/^\[ *ok\] daemon answers: pid [0-9]*, \([0-9]*\) requests answered.*/\1/p' <<<"$out")
  [ -n "$n" ] || die "pycni doctor: no answer from the daemon: $(grep daemon <<<"$out" | tr '\n' ' ')"
  echo "$n"
}
# The plugin calls a client makes for one pod, each a request to the daemon: ADD, CHECK and DEL
# of every plugin in the installed chain (bridge's host-local runs inside bridge's request: the
# installed host-local is our multicall). CRI-O too calls loopback when the conflist has it.
chain_length() {
  python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["plugins"]))' "$CONF_DIR/$CONFLIST"
}
# expect_answered BEFORE CALLS WHAT: the daemon answered exactly CALLS requests since BEFORE.
# (It counts a request when its child is back, just after the reply: a bounded wait for the
# last one, then exact.)
answered_since() { [ $(($(daemon_answered) - $1)) -ge "$2" ]; }
expect_answered() {
  local now
  (wait_until 10 "the daemon to count $2 requests" answered_since "$1" "$2") 2>/dev/null || true
  now=$(daemon_answered)
  [ $((now - $1)) = "$2" ] || die "$3: the daemon answered $((now - $1)) requests, not the $2 plugin calls made"
}

case ${1:?step} in
setup)
  # Every apt package is in the image already; Python packages come from the wheelhouse.
  start=$EPOCHREALTIME
  cd "$ROOT" && PYCNI_WHEELHOUSE=/opt/wheelhouse PYCNI_NO_COMPILE=1 scripts/setup.sh
  echo "setup.sh: $(elapsed "$start")s"
  # cnitool: the image's, built there by this node's Go and libcni from the same source, the
  # way build.sh builds it (vm.py's CNITOOL_HOOKS); built here (18 s idle under TCG) only if the
  # checkout's source is not the image's.
  prebuilt=/usr/local/lib/pycni-cnitool
  if cmp -s "$prebuilt/cnitool.go" "$ROOT/integration/cnitool/cnitool.go"; then
    install -m 0755 "$prebuilt/cnitool" "$CNITOOL"
    echo "ok: cnitool: the image's build of integration/cnitool/cnitool.go"
  else
    start=$EPOCHREALTIME
    "$ROOT/integration/cnitool/build.sh" "$CNITOOL"
    echo "ok: cnitool: built from integration/cnitool/cnitool.go ($(elapsed "$start")s)"
  fi
  ;;
install)
  # As the README tells a user on a node without a package index: the wheel (built on the host
  # from this tree) in a wheelhouse with its dependencies, into a venv, then `pycni install`.
  # (The README's venv is /opt/pycni: here that is the checkout.)
  wheels=("$WHEELHOUSE"/pycni-*.whl)
  [ "${#wheels[@]}" = 1 ] && [ -f "${wheels[0]}" ] || die "not one pycni wheel in $WHEELHOUSE: ${wheels[*]}"
  rm -rf "$PYCNI_VENV"
  python3 -m venv "$PYCNI_VENV"
  "$PYCNI_VENV/bin/pip" install -q --no-index --find-links "$WHEELHOUSE" pycni
  # That pycni, not the checkout's: its package in the venv's site-packages, from / (no checkout
  # on sys.path), the version the wheel names.
  site=$("$PYCNI_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mod=$(cd / && "$PYCNI_VENV/bin/python" -c 'import cni; print(cni.__file__)')
  [ "$mod" = "$site/cni/__init__.py" ] || die "the venv imports cni from $mod, not $site"
  ! "$PYCNI_VENV/bin/pip" show pycni | grep -i '^editable' >/dev/null || die "an editable install"
  version=$(basename "${wheels[0]}" | cut -d- -f2)
  [ "$(pycni --version | awk '{print $NF}')" = "$version" ] \
    || die "pycni --version says '$(pycni --version)', the wheel is $version"
  # Debian 12's libcni (1.1.2, our cnitool) and containerd 1.6 speak spec versions <= 1.0.0.
  bash "$ROOT/integration/vagrant/install-pycni.sh"
  # The installed multicall runs the venv's interpreter on the wheel's package: the copy of it
  # that install keeps in the bin dir (.pycni-lib/<version>-<digest>, which pip never touches).
  head -n1 "$BIN_DIR/pycni-plugin" | grep -xE "#!$PYCNI_VENV/bin/python[0-9.]* -IS" >/dev/null \
    || die "$BIN_DIR/pycni-plugin runs $(head -n1 "$BIN_DIR/pycni-plugin")"
  rootline=$(grep '# pycni:root' "$BIN_DIR/pycni-plugin") || die "no root line in pycni-plugin"
  lib=$(echo "$rootline" | sed -nE "s|^_root = '($BIN_DIR/\.pycni-lib/$version-[0-9a-f]+)'.*|\1|p")
  [ -n "$lib" ] || die "pycni-plugin's root is not a $version copy in $BIN_DIR/.pycni-lib: $rootline"
  diff -rq -x __pycache__ "$site/cni" "$lib/cni" >/dev/null \
    || die "$lib/cni is not the wheel's package ($site/cni)"
  ! grep -r "$ROOT/" "$BIN_DIR/pycni-plugin" /etc/systemd/system/pycni.service >/dev/null \
    || die "the installed plugin or unit names the checkout $ROOT"
  [ "$(systemctl is-enabled pycni.socket)" = enabled ] || die "pycni.socket not enabled"
  [ "$(unit_state pycni.socket)" = active ] || die "pycni.socket not listening"
  [ -S /run/pycni/pycni.sock ] || die "no socket at /run/pycni/pycni.sock"
  # `pycni doctor` (in install-pycni.sh) connected to the daemon's socket: that starts the
  # service, which is active once the daemon serves (Type=notify; seconds under TCG).
  wait_until 120 "doctor's probe to start pycni.service" service_active
  systemctl stop pycni.service  # so that the next step shows a plugin call starting it
  [ "$(unit_state pycni.socket)" = active ] || die "stopping the service closed the socket"
  [ "$(unit_state pycni.service)" = inactive ] || die "pycni.service did not stop"
  grep -q "^ExecStart=$PYCNI_VENV/bin/pycni daemon$" /etc/systemd/system/pycni.service \
    || die "ExecStart is not the wheel's venv's pycni daemon"
  echo "ok: pycni $version installed from its wheel into $PYCNI_VENV; pycni.socket enabled and" \
    "listening; doctor's probe started pycni.service"
  ;;
cnitool)
  # The first plugin call starts the daemon through the socket (socket activation).
  [ "$(unit_state pycni.service)" = inactive ] || die "pycni.service already active"
  CNITOOL=$CNITOOL bash "$ROOT/integration/vagrant/cnitool.sh"
  wait_until 30 "pycni.service started by the socket" service_active
  pid=$(systemctl show -p MainPID --value pycni.service)
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep "pycni daemon" >/dev/null || die "MainPID $pid is not the daemon"
  # The daemon started with cnitool's first call: it answered every one (ADD, CHECK, DEL).
  calls=$((3 * $(chain_length)))
  expect_answered 0 "$calls" "cnitool's pod"
  echo "ok: socket activation started pycni.service (MainPID $pid), which answered all" \
    "$calls plugin calls of cnitool's pod"
  ;;
cri)
  # containerd's CRI, driven by our CRI client as kubelet does, pycni and the reference as
  # oracle; in its own namespaces, so the node's installed pycni is not involved.
  cd "$ROOT" && scripts/test.sh -q integration/test_cri.py
  ;;
daemonset)
  # deploy/pycni.yaml's DaemonSet pod through containerd's CRI as kubelet runs it, and CRI pods
  # networked by its daemon, a rolling update, the pod gone (11) and back; the image built on
  # the host (vm.py's pod-image step). No podman on the node: its kube play case is deselected;
  # so is the conf_template one (the manifest's install choice, shown by make test on the host:
  # each case is minutes under TCG). The cases' containerds start on copies of one containerd
  # root the images were imported into once (test_daemonset.py's node_images: importing
  # pycni's image takes ~100 s under TCG).
  # Like cri, on throwaway nodes (own containerd, netns, CNI dirs and socket, in test.sh's
  # private mounts): the installed pycni, its socket and its store are not touched.
  cd "$ROOT" && PYCNI_IMAGE_ARCHIVE=$ROOT/build/image/pycni.oci.tar \
    scripts/test.sh -q integration/test_daemonset.py -k "not podman and not conf_template"
  ;;
crio)
  # CRI-O 1.33.5 (shared/reference/bin's crio and pinns, copied in by vm.py) on the installed
  # pycni, as kubelet drives it (our CRI client: no crictl): a pod with a hostPort and the
  # bandwidth annotations. Its plugins get no in-process fallback: the socket-activated daemon
  # must serve each call.
  bash "$ROOT/integration/vagrant/crio-binaries.sh" /opt/crio-bin
  install -d /run/systemd/system/crio.service.d
  printf '[Service]\nEnvironment=PYCNI_SHIM_FALLBACK=0\n' \
    > /run/systemd/system/crio.service.d/pycni-no-fallback.conf
  systemctl daemon-reload
  [ "$(unit_state pycni.socket)" = active ] || die "pycni.socket not listening"
  before=$(daemon_answered)
  bash "$ROOT/integration/vagrant/crio.sh" || {
    journalctl -u crio -u pycni.service -n 80 --no-pager || true
    die "the CRI-O scenario (crio.sh) failed: CRI-O's and the daemon's journal above"
  }
  [ "$(systemctl show -p Environment --value crio.service)" = PYCNI_SHIM_FALLBACK=0 ] \
    || die "crio.service ran without PYCNI_SHIM_FALLBACK=0"
  rm /run/systemd/system/crio.service.d/pycni-no-fallback.conf
  systemctl daemon-reload
  # ADD, then CHECK right after it, then one DEL (StopPodSandbox), of each plugin of the chain:
  # CRI-O brings lo up itself, and still calls the conflist's loopback.
  calls=$((3 * $(chain_length)))
  expect_answered "$before" "$calls" "CRI-O's pod"
  echo "ok: CRI-O $(crio --version | sed -n 's/^crio version //p') (systemd cgroups) ran a" \
    "pod on pycni: address, HTTP to the pod and its hostPort, tbf at 1Mbit, removal, nothing" \
    "left; the daemon answered all $calls plugin calls (fallback off)"
  ;;
vlan)
  # This kernel has bridge VLAN filtering: the VLAN tests must run, not skip.
  cd "$ROOT"
  out=$(scripts/test.sh -q -rs tests/test_bridge.py -k vlan 2>&1) || { echo "$out"; die "vlan tests"; }
  echo "$out" | tail -n 3
  if echo "$out" | grep SKIPPED >/dev/null; then die "VLAN tests skipped on the VM kernel"; fi
  echo "$out" | grep "2 passed" >/dev/null || die "expected 2 VLAN tests to pass"
  echo "ok: tests/test_bridge.py's 2 VLAN tests passed on the guest kernel (vlan, vlanTrunk," \
    "preserveDefaultVlan; traffic within a VLAN, none across)"
  ;;
pods-before-reboot)
  # Three pods through the installed chain, left attached when the node reboots.
  rm -rf "$STATE" && mkdir -p "$STATE"
  # (Debian's podman has one: `D! /var/lib/cni/networks` empties the store at every boot.)
  if rule=$(grep -rs '/var/lib/cni' /usr/lib/tmpfiles.d /etc/tmpfiles.d); then
    die "a tmpfiles.d rule would clean the CNI state at boot: $rule"
  fi
  export CNI_PATH=$BIN_DIR NETCONFPATH=$CONF_DIR
  for i in 1 2 3; do
    ip netns add "vm-pod$i"
    CAP_ARGS="{\"portMappings\":[{\"hostPort\":$((8090 + i)),\"containerPort\":80,\"protocol\":\"tcp\"}],
      \"bandwidth\":{\"ingressRate\":1000000,\"ingressBurst\":100000,\"egressRate\":1000000,\"egressBurst\":100000}}" \
      "$CNITOOL" add "$NETWORK" "/var/run/netns/vm-pod$i" > "$STATE/pod$i.json"
  done
  # And a fourth the way kubelet makes one: RunPodSandbox on the node's containerd, with a
  # hostPort and the bandwidth annotations.
  containerd_offline
  # (kubelet names a systemd slice as the pod cgroup parent: SystemdCgroup = true wants one)
  cri run vm-cri-pod --wait-image "$OFFLINE_PAUSE" --cgroup-parent system.slice \
    --port 8099:80 \
    --annotation kubernetes.io/ingress-bandwidth=1M \
    --annotation kubernetes.io/egress-bandwidth=1M > "$STATE/cri.json"
  pod=$(json_key "$STATE/cri.json" pod)
  [ -e "/var/lib/cni/results/$NETWORK-$pod-eth0" ] || die "no libcni cache entry for the CRI pod"
  reservations > "$STATE/reservations"
  [ "$(wc -l < "$STATE/reservations")" = 4 ] || die "expected 4 reservations"
  [ "$(cached | wc -l)" = 3 ] || die "expected 3 libcni cache entries of cnitool's pods"
  rules=$(nft list ruleset | grep -c -e 'cnitool-' -e "$pod" || true)
  [ "$rules" -ge 8 ] || die "expected hostPort and masquerade rules for 4 pods, found $rules"
  ifbs=$(ip -o link show type ifb | grep -c bwp || true)
  [ "$ifbs" = 4 ] || die "expected 4 ifbs, found $ifbs"
  echo "ok: 3 pods by cnitool, 1 by containerd's CRI ($(xargs < "$STATE/reservations"))," \
    "$rules nft rules, $ifbs ifbs naming them"
  sync
  ;;
after-reboot)
  # Namespaces, veths, ifbs and nft rules died with the kernel; the store and libcni's cache
  # are on disk. The daemon is not running until the first plugin call starts it.
  [ -s "$STATE/reservations" ] || die "no record from before the reboot"
  [ "$(unit_state pycni.socket)" = active ] || die "pycni.socket not listening after boot"
  [ "$(unit_state pycni.service)" = inactive ] || die "pycni.service started before any request"
  pod=$(json_key "$STATE/cri.json" pod)
  [ "$(reservations | wc -l)" = 4 ] || die "expected the dead pods' 4 reservations on disk"
  [ "$(cached | wc -l)" = 3 ] || die "expected libcni's cache of cnitool's 3 dead pods"
  [ -e "/var/lib/cni/results/$NETWORK-$pod-eth0" ] || die "the CRI pod's cache entry is gone"
  for i in 1 2 3; do [ ! -e "/var/run/netns/vm-pod$i" ] || die "vm-pod$i survived the reboot"; done
  ! ip -o link show type ifb | grep bwp >/dev/null || die "an ifb survived the reboot"
  ! nft list ruleset | grep -e cnitool- -e "$pod" >/dev/null || die "nft rules survived the reboot"
  export CNI_PATH=$BIN_DIR NETCONFPATH=$CONF_DIR
  # A runtime cleaning up a pod that died with the node (containerd's StopPodSandbox after a
  # restart): libcni's DEL of pod 1, whose netns is gone. The first plugin call since boot:
  # pycni.socket holds it while systemd starts the daemon.
  start=$EPOCHREALTIME
  "$CNITOOL" del "$NETWORK" /var/run/netns/vm-pod1
  del_s=$(elapsed "$start")
  wait_until 30 "the first plugin call to start pycni.service" service_active
  ready_s=$(systemctl show pycni.service -p InactiveExitTimestampMonotonic \
    -p ActiveEnterTimestampMonotonic --value | awk 'NR==1{a=$1} NR==2{b=$1} END{printf "%.2f", (b-a)/1e6}')
  [ "$(reservations | wc -l)" = 3 ] || die "libcni's DEL did not release pod 1's reservation"
  [ "$(cached | wc -l)" = 2 ] || die "libcni's DEL did not remove pod 1's cache entry"
  # kubelet after a node reboot: containerd recovered the sandbox NOTREADY; StopPodSandbox runs
  # the DEL chain with an empty CNI_NETNS (its netns died), RemovePodSandbox forgets it.
  wait_until 60 "containerd's CRI" cri version
  start=$EPOCHREALTIME
  cri rm "$pod" >/dev/null
  cri_s=$(elapsed "$start")
  [ "$(reservations | wc -l)" = 2 ] || die "StopPodSandbox did not release the CRI pod's address"
  [ ! -e "/var/lib/cni/results/$NETWORK-$pod-eth0" ] || die "the CRI pod's cache entry is left"
  # pycni gc: every cached attachment left is stale (no valid list): DEL each, then each
  # plugin's GC with an empty valid list.
  start=$EPOCHREALTIME
  pycni gc "$NETWORK"
  gc_s=$(elapsed "$start")
  [ "$(reservations | wc -l)" = 0 ] || die "gc left reservations: $(reservations | tr '\n' ' ')"
  [ "$(cached | wc -l)" = 0 ] || die "gc left cached results"
  ! nft list ruleset | grep cnitool- >/dev/null || die "nft rules naming a dead pod"
  ! ip -o link show type ifb | grep bwp >/dev/null || die "ifbs left"
  # New pods work on the rebooted node, through the daemon.
  before=$(daemon_answered)
  CNITOOL=$CNITOOL bash "$ROOT/integration/vagrant/cnitool.sh"
  expect_answered "$before" $((3 * $(chain_length))) "a new cnitool pod"
  echo "ok: first plugin call after boot started pycni.service by the socket (daemon ready" \
    "in ${ready_s}s; that libcni DEL of dead pod 1 took ${del_s}s); CRI StopPodSandbox +" \
    "RemovePodSandbox of the dead CRI pod ${cri_s}s; pycni gc released pods 2, 3 (${gc_s}s);" \
    "nothing left; a new pod works"
  ;;
uninstall)
  pycni uninstall --bin-dir "$BIN_DIR"
  [ ! -e /etc/systemd/system/pycni.socket ] || die "pycni.socket left"
  [ "$(systemctl is-enabled pycni.socket 2>/dev/null || true)" != enabled ] || die "still enabled"
  [ "$(unit_state pycni.service)" = inactive ] || die "daemon still running"
  [ ! -e "$BIN_DIR/bridge" ] || die "plugins left in $BIN_DIR"
  echo "ok: uninstalled, units disabled and removed"
  ;;
*)
  die "unknown step $1"
  ;;
esac
