"""The sealed engine: its door, bundles and kernels."""
