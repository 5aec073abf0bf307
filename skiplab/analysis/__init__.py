"""Analyses the papers rely on: gradient flow, learned ratios and gates."""
