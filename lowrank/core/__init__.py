"""The shared layer: validation, spectral quantities, data, networks, training primitives."""
