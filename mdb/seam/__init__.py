"""Layer 1, the broker seam: what the core needs from a broker (``broker``), and the
installed adapters, found by a broker URL's scheme (``registry``).
docs/architecture.md, "The broker seam"."""
