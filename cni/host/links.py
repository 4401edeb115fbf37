"""Links: bring up, look up, read addresses. Everything by name inside a namespace."""

from __future__ import annotations

from cni.host import netns

IFF_UP = 0x1


def _addresses(ipr, index: int) -> list[str]:
    out = []
    for family in (2, 10):  # AF_INET, AF_INET6: v4 first, as the reference lists them
        for msg in ipr.get_addr(family=family, index=index):
            out.append(f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}")
    return out


def set_loopback(target: int | str, up: bool) -> list[str]:
    """Set lo up or down in the namespace; returns lo's addresses (after the change)."""
    with netns.iproute(target) as ipr:
        index = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=index, state="up" if up else "down")
        return _addresses(ipr, index) if up else []


def loopback_is_up(target: int | str) -> bool:
    with netns.iproute(target) as ipr:
        link = ipr.get_links(ipr.link_lookup(ifname="lo")[0])[0]
        return bool(link["flags"] & IFF_UP)
