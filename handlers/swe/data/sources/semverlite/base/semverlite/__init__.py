"""Semantic versions: parse, compare, match ranges."""
from semverlite.ranges import max_satisfying, satisfies
from semverlite.version import InvalidVersion, Version, compare

__all__ = ["InvalidVersion", "Version", "compare", "max_satisfying", "satisfies"]
__version__ = "0.4.0"
