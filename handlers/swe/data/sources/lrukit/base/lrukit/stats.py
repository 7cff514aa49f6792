from dataclasses import dataclass


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0

    @property
    def hit_rate(self):
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def reset(self):
        self.hits = self.misses = self.evictions = 0
