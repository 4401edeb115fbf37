"""The plugins other packages declare (entry point group `pycni.plugins`, cni.registry.discover)
as install links them: each imported once, to read the versions it speaks for the VERSION table
baked into the executable (render.PLUGINS_TAG), so the shim never reads package metadata. Install
calls this after trust.py has passed the sys.path dirs these packages are imported from."""

from __future__ import annotations

from cni import registry


def plugin_table() -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """The entry-point plugins to link: name -> (target, its SUPPORTED_FROM or ""); and those
    skipped: name -> why (refused by the registry, or failing to import)."""
    from cni import skel

    table, skipped = {}, {}
    for name, target in registry.discover(refresh=True).items():
        try:
            skel.load(name)
        except Exception as e:  # the others are still linked
            skipped[name] = f"importing {target} failed: {type(e).__name__}: {e}"
            continue
        table[name] = (target, registry.SUPPORTED_FROM.get(name, ""))
    return table, {**registry.REFUSED, **skipped}
