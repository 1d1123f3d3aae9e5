"""Maintainer tools (notebook builder, release helpers); not used by learners."""
