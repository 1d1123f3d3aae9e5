"""Checks, one module per unit: ``uNN_slug.py``."""
