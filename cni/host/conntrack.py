"""Connection tracking: drop UDP entries by original destination port, over netlink.

A UDP "connection" to a hostPort stays in conntrack while the client keeps sending; packets
that match it skip the nat table, so a new DNAT rule never applies to them and a moved hostPort
blackholes (containernetworking/plugins #123, #1190). Deleting the entries makes the next packet
go through the current rules. Works in the caller's current network namespace.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable

IPPROTO_UDP = 17
_AF = {4: socket.AF_INET, 6: socket.AF_INET6}


def delete_udp_dport(family: int, ports: Iterable[int]) -> int:
    """Delete every UDP entry of `family` whose original destination port is in `ports`.

    Returns how many were deleted; entries that vanish meanwhile are not an error.
    """
    wanted = {int(p) for p in ports}
    if not wanted:
        return 0
    from pyroute2.netlink.exceptions import NetlinkError
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    from cni.host.nlsync_conntrack import SyncConntrack  # no event loop; installs lean_pyroute2

    af = _AF[family]
    deleted = 0
    with SyncConntrack(af) as ct:
        # The kernel filters on the protocol (5.8+; pyroute2 filters again on its side).
        found = [e for e in ct.dump_entries(tuple_orig=NFCTAttrTuple(family=af,
                                                                      proto=IPPROTO_UDP))
                 if e.tuple_orig.dport in wanted]
        for entry in found:
            try:
                ct.delete(entry)
                deleted += 1
            except NetlinkError as e:
                if e.code != errno.ENOENT:
                    raise
    return deleted
