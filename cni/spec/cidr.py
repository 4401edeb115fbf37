"""A CIDR as a config key or a command line gives one (bridge nonMasqueradeCIDRs, `pycni install
--pod-cidr/--cluster-cidr`): pure, one rule for both."""

from __future__ import annotations

import ipaddress

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def network(value: str) -> Network:
    """An IPv4 or IPv6 network with its prefix length written out and no host bits set, as
    ipaddress's strict parse and netaddr's `cidr` judge it ("10.244.0.1/16", most likely a typo,
    is refused naming 10.244.0.0/16), and no IPv6 scope ID (ipaddress keeps `%...` verbatim in
    the network's text, which goes into nft rules and files). ValueError says why not."""
    if "/" not in value or "%" in value:
        raise ValueError("not a CIDR (address/prefix length)")
    try:
        return ipaddress.ip_network(value)
    except ValueError as e:
        try:
            hint = f" (did you mean {ipaddress.ip_network(value, strict=False)}?)"
        except ValueError:
            hint = ""
        raise ValueError(f"not a CIDR: {e}{hint}") from None
