"""Part III: square-loss dynamics of weight-normalised networks (Xu, Rangamani, Liao, Galanti, Poggio)."""
