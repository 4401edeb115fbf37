#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# cnitool (libcni's own runner) against the installed plugins: add with a hostPort and bandwidth
# as capability args, check, traffic, del; nothing left.
. "$(dirname "$0")/lib.sh"
ns=pycni-cnitool-$RANDOM
ip netns add "$ns"
srv=""
cleanup() { [ -n "$srv" ] && kill "$srv" 2>/dev/null; ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT
export CNI_PATH=$BIN_DIR NETCONFPATH=$CONF_DIR
export CAP_ARGS="{\"portMappings\":[{\"hostPort\":$HOSTPORT,\"containerPort\":80,\"protocol\":\"tcp\"}],
  \"bandwidth\":{\"ingressRate\":1000000,\"ingressBurst\":100000,\"egressRate\":1000000,\"egressBurst\":100000}}"

log "cnitool add $NETWORK /var/run/netns/$ns"
"$CNITOOL" add "$NETWORK" "/var/run/netns/$ns" | tee /dev/stderr \
  | python3 -c 'import json, sys; assert json.load(sys.stdin)["ips"], "no ips"' 
ip=$(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)
[ -n "$ip" ] || die "no address in $ns"
log "cnitool check"
"$CNITOOL" check "$NETWORK" "/var/run/netns/$ns"
log "traffic: gateway, hostPort"
gw=$(ip -n "$ns" -4 route show default | awk '{print $3}')
ip netns exec "$ns" ping -c1 -W3 "$gw" >/dev/null || die "gateway $gw unreachable"
mkdir -p /tmp/"$ns"-www && echo hello-from-pycni > /tmp/"$ns"-www/index.html
ip netns exec "$ns" busybox httpd -f -p 80 -h /tmp/"$ns"-www &
srv=$!
addr=$(node_ip)
wait_until 20 "the hostPort" curl -fsS --max-time 3 "http://$addr:$HOSTPORT/"
has_tbf 1Mbit || die "no tbf at 1Mbit"
kill "$srv"; srv=""
rm -rf /tmp/"$ns"-www
log "cnitool del"
id=cnitool-$(printf '%s' "/var/run/netns/$ns" | sha512sum | cut -c1-20)
"$CNITOOL" del "$NETWORK" "/var/run/netns/$ns"
leftovers "$id"
echo "ok: cnitool"
