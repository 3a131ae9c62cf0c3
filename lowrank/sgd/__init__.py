"""Part II: SGD with weight decay trains low-rank networks (Galanti, Siegel, Gupte, Poggio)."""
