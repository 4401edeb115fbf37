"""The plugins other packages declare (entry point group `pycni.plugins`, cni.registry.discover)
as install links them: found in the site dirs of the interpreter the executables run (those
trust.py has passed), their files checked and their import tried in a child with a deadline
(cni.plugload): the versions each speaks, for the VERSION table baked into the executable
(render.PLUGINS_TAG), come from that child, so install never imports another package's code
itself, and the shim never reads package metadata."""

from __future__ import annotations

from cni import plugload, registry


def plugin_table(sites: list[str], python: str | None = None
                 ) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """The entry-point plugins to link: name -> (target, its SUPPORTED_FROM or ""); and those
    skipped: name -> why (refused by the registry or plugload)."""
    found = registry.discover(refresh=True, sites=sites)
    ok, refused = plugload.vet(found, sites, python)
    table = {name: (found[name], first) for name, first in ok.items()}
    return table, {**registry.REFUSED, **refused}
