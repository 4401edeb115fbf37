"""IPAM: the host-local allocator and its on-disk store, and delegation to IPAM plugins."""
