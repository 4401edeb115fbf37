"""One nftables batch for a plugin's verb, rebuilt and retried when it raced another process's:
portmap and firewall delete rules by handle, and a concurrent DEL may have removed one first."""

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
