#!/usr/bin/env bash
# Usage: node.sh [--netns NAME] [--cni-bin DIR] [--cni-conf DIR] [--cni-state DIR] -- CMD [ARG...]
#
# Runs CMD as if on a node whose network is the namespace NAME: in that network namespace, in a
# private mount namespace with a /sys of that namespace (as `ip netns exec` gives) that keeps the
# cgroup mounts (which `ip netns exec` drops and runc needs); and, if asked, with /opt/cni/bin,
# /etc/cni/net.d and /var/lib/cni replaced by DIRs, for clients whose CNI dirs are fixed
# (`ctr run --cni`). The machine's real dirs are never written: a missing mount point is made
# inside an overlay (upper layer on a tmpfs) of its deepest existing parent.
# Without --netns the current network namespace is kept. CMD is exec'd: its pid is this one's,
# so `nsenter -t PID -m -n` joins this node from elsewhere (the tests keep a `sleep` here).
set -euo pipefail
netns="" bin="" conf="" state=""
while [ $# -gt 0 ]; do
  case $1 in
    --netns) netns=$2; shift 2 ;;
    --cni-bin) bin=$(readlink -f "$2"); shift 2 ;;
    --cni-conf) conf=$(readlink -f "$2"); shift 2 ;;
    --cni-state) state=$(readlink -f "$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "node.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "node.sh: no command" >&2; exit 2; }

if [ "${_PYCNI_NODE_NS:-}" != 1 ]; then
  export _PYCNI_NODE_NS=1
  args=()
  [ -n "$netns" ] && args+=(--netns "$netns")
  [ -n "$bin" ] && args+=(--cni-bin "$bin")
  [ -n "$conf" ] && args+=(--cni-conf "$conf")
  [ -n "$state" ] && args+=(--cni-state "$state")
  enter=()
  [ -n "$netns" ] && enter=(nsenter "--net=/run/netns/$netns")
  exec "${enter[@]}" unshare --mount --propagation private -- "$0" "${args[@]}" -- "$@"
fi
unset _PYCNI_NODE_NS

# Scratch space on a tmpfs of this mount namespace only; the on-disk mount point is removed
# below, and the tmpfs lives on (referenced by the mounts) until this namespace goes away.
scratch=$(mktemp -d /tmp/pycni-node.XXXXXX)
mount -t tmpfs pycni-node "$scratch"

if [ -n "$netns" ]; then
  mkdir "$scratch/cgroup"
  mount --rbind /sys/fs/cgroup "$scratch/cgroup"
  umount -l /sys
  mount -t sysfs sysfs /sys  # a sysfs mounted now shows this network namespace
  mount --move "$scratch/cgroup" /sys/fs/cgroup
fi

ensure_dir() {
  local dst=$1 anc=$1 n
  [ -d "$dst" ] && return 0
  while [ ! -d "$anc" ]; do anc=$(dirname "$anc"); done
  n=$(mktemp -d "$scratch/ov.XXXXXX")
  mkdir "$n/up" "$n/work"
  mount -t overlay pycni-node -o "lowerdir=$anc,upperdir=$n/up,workdir=$n/work" "$anc"
  mkdir -p "$dst"
}
if [ -n "$bin" ]; then ensure_dir /opt/cni/bin; mount --bind "$bin" /opt/cni/bin; fi
if [ -n "$conf" ]; then ensure_dir /etc/cni/net.d; mount --bind "$conf" /etc/cni/net.d; fi
if [ -n "$state" ]; then ensure_dir /var/lib/cni; mount --bind "$state" /var/lib/cni; fi

umount -l "$scratch"
rmdir "$scratch"
exec "$@"
