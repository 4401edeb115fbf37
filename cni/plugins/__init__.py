"""One module per plugin, each reading like the reference's cmdAdd / cmdDel / cmdCheck; which
name maps to which module is cni.registry. Modules are imported only when a verb needs them, so
VERSION never pays for their imports."""
