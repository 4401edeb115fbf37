#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Usage: crictl-pod.sh RUNTIME_ENDPOINT
# One pod through crictl: a sandbox with a hostPort and bandwidth annotations, an httpd container
# in it; checks the pod's address, the hostPort from the node's address, the tbf shaping; then
# stops and removes it and checks nothing is left (reservation, nft rule, cache, ifb).
# Without crictl (an offline node: provision.sh could not reach its repository) the same calls
# go through our CRI client (integration/cri), with images built offline (offline_image; the
# runtime's sandbox image must be OFFLINE_PAUSE, as containerd_offline sets it).
. "$(dirname "$0")/lib.sh"
endpoint=${1:?runtime endpoint, e.g. unix:///run/containerd/containerd.sock}
crictl() { command crictl --runtime-endpoint "$endpoint" --image-endpoint "$endpoint" \
  --timeout 60s "$@"; }
work=$(mktemp -d)
mkdir -p "$work/logs"
trap 'rm -rf "$work"' EXIT
uid=pycni-$RANDOM
web='echo hello-from-pycni > /www/index.html && exec httpd -f -p 80 -h /www'

crictl_up() {  # sets pod, ctr
  cat > "$work/pod.json" <<JSON
{
  "metadata": {"name": "pycni-web", "namespace": "default", "uid": "$uid", "attempt": 1},
  "hostname": "pycni-web",
  "log_directory": "$work/logs",
  "port_mappings": [{"protocol": 0, "container_port": 80, "host_port": $HOSTPORT}],
  "annotations": {"kubernetes.io/ingress-bandwidth": "1M",
                  "kubernetes.io/egress-bandwidth": "1M"},
  "linux": {}
}
JSON
  cat > "$work/ctr.json" <<JSON
{
  "metadata": {"name": "httpd"},
  "image": {"image": "$TEST_IMAGE"},
  "command": ["sh", "-c", "mkdir -p /www && $web"],
  "log_path": "httpd.log",
  "linux": {}
}
JSON
  log "crictl ($endpoint): pull, runp, create, start"
  crictl pull "$TEST_IMAGE" >/dev/null
  pod=$(crictl runp "$work/pod.json")
  ctr=$(crictl create "$pod" "$work/ctr.json" "$work/pod.json")
  crictl start "$ctr" >/dev/null
}
crictl_ip() { crictl inspectp -o go-template --template '{{.status.network.ip}}' "$pod"; }
crictl_down() {
  crictl stop "$ctr" >/dev/null
  crictl rm "$ctr" >/dev/null
  crictl stopp "$pod" >/dev/null
  crictl rmp "$pod" >/dev/null
}

ours_up() {  # sets pod
  export CRI_SOCKET=${endpoint#unix://}
  log "no crictl: our CRI client ($endpoint): RunPodSandbox, CreateContainer, StartContainer" \
    "of $OFFLINE_BUSYBOX, built offline"
  offline_image "$OFFLINE_BUSYBOX" /bin/sh
  # (kubelet names a systemd slice as the pod cgroup parent: SystemdCgroup = true wants one)
  cri run pycni-web --wait-image "$OFFLINE_BUSYBOX" --log-dir "$work/logs" \
    --cgroup-parent system.slice --port "$HOSTPORT:80" \
    --annotation kubernetes.io/ingress-bandwidth=1M \
    --annotation kubernetes.io/egress-bandwidth=1M \
    --image "$OFFLINE_BUSYBOX" -- /bin/sh -c "$web" > "$work/run.json"
  pod=$(json_key "$work/run.json" pod)
}
ours_ip() { cri ip "$pod" > "$work/ip.json" && json_key "$work/ip.json" ip; }
ours_down() {  # kubelet's order: the container stopped and removed, then Stop/RemovePodSandbox
  local args=() id
  for id in $(python3 -c 'import json, sys; print(*json.load(open(sys.argv[1]))["containers"])' \
    "$work/run.json"); do
    args+=(--container "$id")
  done
  cri rm "$pod" "${args[@]}" >/dev/null
}

client=ours
type -P crictl >/dev/null && client=crictl  # (a PATH lookup: crictl is also the function above)
"${client}_up"
ip=$("${client}_ip")
echo "pod $pod has $ip"
[ -n "$ip" ] || die "the pod has no IP"
ls /var/lib/cni/networks/"$NETWORK"/"$ip" >/dev/null || die "no host-local reservation for $ip"

log "hostPort $HOSTPORT from the node's address, then the pod directly"
addr=$(node_ip)
wait_until 30 "the hostPort" curl -fsS --max-time 3 "http://$addr:$HOSTPORT/"
[ "$(curl -fsS --max-time 3 "http://$addr:$HOSTPORT/")" = hello-from-pycni ] || die "bad body"
[ "$(curl -fsS --max-time 3 "http://$ip/")" = hello-from-pycni ] || die "pod not reachable"

log "bandwidth annotations: tbf at 1Mbit on the veth and the ifb"
has_tbf 1Mbit || die "no tbf qdisc at 1Mbit"
ip -br link show type ifb | grep '^bwp' >/dev/null || die "no bwp ifb for egress shaping"

log "stop and remove; nothing left"
"${client}_down"
leftovers "$pod"
! ip -br link show type ifb | grep '^bwp' >/dev/null || die "bwp ifb left behind"
! curl -fsS --max-time 3 "http://$addr:$HOSTPORT/" >/dev/null 2>&1 || die "hostPort still answers"
echo "ok: $endpoint ($client)"
