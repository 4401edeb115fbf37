"""What portmap and firewall, the plugins that live on nftables, share: one batch for a verb,
rebuilt and retried when it raced another process's (both delete rules by handle, and a
concurrent DEL may have removed one first), and STATUS's check that nftables is usable."""

from __future__ import annotations

from collections.abc import Callable

from cni.host import nft
from cni.spec.errors import CNIError, Code

RETRIES = 3


def apply(script: Callable[[int], str], what: str) -> None:
    """Run the batch script(attempt) builds (a retry lists afresh, so the handles are current);
    an empty script means nothing to do. `what` names the rules in the final error."""
    for attempt in range(RETRIES):
        text = script(attempt)
        if not text:
            return
        try:
            nft.run(text)
            return
        except nft.NftUnavailable as e:
            raise CNIError(Code.NOT_AVAILABLE, str(e)) from None
        except nft.NftError as e:
            if attempt == RETRIES - 1:
                raise CNIError(Code.INTERNAL, f"unable to set up nftables rules for {what}: "
                               f"{e}") from None


def require_nftables(plugin: str) -> None:
    """STATUS of a plugin that lives on nftables: error 50 saying why it is not usable."""
    ok, why = nft.available()
    if not ok:
        raise CNIError(Code.NOT_AVAILABLE, f"{plugin}: nftables is not usable: {why}")
