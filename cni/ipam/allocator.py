"""Allocation from a range set, as the reference's allocator (plugins/ipam/host-local/backend).

Round-robin: start after `last_reserved_ip.<idx>` when it lies in the set (else at the first
range's start), walk the ranges in order, wrap, skip each range's gateway, stop when back at the
start. Each candidate costs one O_EXCL create, so a store with many reservations is not scanned.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from netaddr import IPAddress, iter_iprange

from cni.ipam.config import Range, RangeSet
from cni.ipam.store import Store
from cni.spec.errors import CNIError, Code

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_ip(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def candidates(ranges: RangeSet, last: Address | None) -> Iterator[tuple[Range, IPAddress]]:
    """(range, address) in the reference's RangeIter order, gateways skipped: after `last` to
    the end of its range, the ranges after it, wrapping, then its range up to `last` itself."""
    found = None
    if last is not None:
        ip = IPAddress(int(last), last.version)
        found = next(((i, ip) for i, r in enumerate(ranges) if ip in r.pool), None)
    idx, after = found or (0, None)
    here = ranges[idx]
    walk: list[tuple[Range, IPAddress, IPAddress]] = []
    if after is None:
        walk.append((here, here.pool[0], here.pool[-1]))
    elif after != here.pool[-1]:
        walk.append((here, after + 1, here.pool[-1]))
    walk += [(r, r.pool[0], r.pool[-1]) for r in ranges[idx + 1:] + ranges[:idx]]
    if after is not None:
        walk.append((here, here.pool[0], after))
    for r, first, last_ip in walk:
        for ip in iter_iprange(first, last_ip):
            if ip != r.gateway:
                yield r, ip


def result_ip(r: Range, ip: IPAddress) -> dict[str, str]:
    return {"address": f"{r.ip(ip)}/{r.network.prefixlen}", "gateway": r.ip(r.gateway)}


class Allocator:
    """One range set of a network (the reference's IPAllocator); the caller holds the lock."""

    def __init__(self, ranges: RangeSet, store: Store, range_id: int) -> None:
        self.ranges = ranges
        self.store = store
        self.range_id = range_id

    def get(self, container_id: str, ifname: str, requested: Address | None,
            owned: list[Address]) -> dict[str, str]:
        """Reserve one IP for the attachment; `owned` are the IPs it already holds anywhere."""
        if requested is not None:
            return self._get_requested(container_id, ifname, requested)
        for ip in owned:
            if self.ranges.range_for(ip) is not None:
                raise CNIError(Code.INTERNAL, f"{ip} has been allocated to {container_id}, "
                               "duplicate allocation is not allowed")
        last = parse_ip(self.store.last_reserved(self.range_id) or "")
        for r, ip in candidates(self.ranges, last):
            if self.store.reserve(container_id, ifname, r.ip(ip), self.range_id):
                return result_ip(r, ip)
        raise CNIError(Code.INTERNAL, f"no IP addresses available in range set: {self.ranges}")

    def _get_requested(self, container_id: str, ifname: str, ip: Address) -> dict[str, str]:
        r = self.ranges.range_for(ip)
        if r is None:
            raise CNIError(Code.INVALID_CONFIG, f"{ip} not in range set {self.ranges}")
        if IPAddress(int(ip), ip.version) == r.gateway:
            raise CNIError(Code.INVALID_CONFIG, f"requested ip {ip} is subnet's gateway")
        if not self.store.reserve(container_id, ifname, str(ip), self.range_id):
            raise CNIError(Code.INTERNAL, f"requested IP address {ip} is not available in "
                           f"range set {self.ranges}")
        return result_ip(r, IPAddress(int(ip), ip.version))
