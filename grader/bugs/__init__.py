"""The bug catalog: known-wrong implementations (mutants), one module per unit: ``uNN_slug.py``."""
