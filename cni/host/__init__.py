"""Everything that touches the kernel: small functions, no CNI knowledge."""
