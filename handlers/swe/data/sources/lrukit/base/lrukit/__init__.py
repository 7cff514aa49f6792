"""An LRU cache with statistics."""
from lrukit.cache import LRUCache
from lrukit.decorators import lru_cached
from lrukit.stats import CacheStats

__all__ = ["CacheStats", "LRUCache", "lru_cached"]
