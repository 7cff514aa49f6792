"""``@lru_cached(capacity)``: memoise a function of hashable arguments in an LRUCache."""
import functools

from lrukit.cache import LRUCache

_MISSING = object()


def lru_cached(capacity=128):
    def decorate(function):
        cache = LRUCache(capacity)

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            key = (args, tuple(sorted(kwargs.items())))
            value = cache.get(key, _MISSING)
            if value is _MISSING:
                value = function(*args, **kwargs)
                cache.put(key, value)
            return value

        wrapper.cache = cache
        return wrapper

    return decorate
