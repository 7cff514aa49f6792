"""``LRUCache``: a bounded mapping that evicts the least recently used entry first."""
from collections import OrderedDict

from lrukit.stats import CacheStats

_MISSING = object()


class LRUCache:
    """Entries are kept in use order, least recently used first (an OrderedDict)."""

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.stats = CacheStats()
        self._data = OrderedDict()

    def get(self, key, default=None):
        """The value for ``key`` (counted as a use), or ``default``."""
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.stats.misses += 1
            return default
        self.stats.hits += 1
        return value

    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)
            self.stats.evictions += 1

    def pop(self, key, default=None):
        return self._data.pop(key, default)

    def peek(self, key, default=None):
        """The value for ``key`` without counting a use or a hit."""
        return self._data.get(key, default)

    def keys(self):
        """Keys from least to most recently used."""
        return list(self._data)

    def clear(self):
        self._data.clear()

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)
