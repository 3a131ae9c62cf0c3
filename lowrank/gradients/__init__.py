"""Part I: rank-two structure of two-layer networks' gradients (Sonthalia, Murray, Montúfar)."""
