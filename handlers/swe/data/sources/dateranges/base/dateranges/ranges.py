"""``DateRange``: both ends included, iterable by a step of whole days."""
from dataclasses import dataclass
from datetime import date, timedelta


@dataclass(frozen=True)
class DateRange:
    start: date
    end: date

    def __post_init__(self):
        if self.end < self.start:
            raise ValueError(f"range ends ({self.end}) before it starts ({self.start})")

    def __len__(self):
        return (self.end - self.start).days + 1

    def __contains__(self, day):
        return self.start <= day <= self.end

    def __iter__(self):
        return self.days()

    def days(self, step=1):
        if step < 1:
            raise ValueError("step must be a positive number of days")
        day = self.start
        while day <= self.end:
            yield day
            day += timedelta(days=step)

    def overlaps(self, other):
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other):
        if not self.overlaps(other):
            return None
        return DateRange(max(self.start, other.start), min(self.end, other.end))

    @classmethod
    def parse(cls, text):
        """``"2024-03-01..2024-03-31"`` (ISO dates around two dots)."""
        start, sep, end = text.partition("..")
        if not sep:
            raise ValueError(f"expected 'START..END', got {text!r}")
        return cls(date.fromisoformat(start.strip()), date.fromisoformat(end.strip()))
