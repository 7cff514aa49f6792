"""Calendar month arithmetic on ``datetime.date``."""
import calendar
from datetime import date


def month_end(day):
    """The last day of ``day``'s month."""
    return date(day.year, day.month, calendar.monthrange(day.year, day.month)[1])


def add_months(day, months):
    """``day`` moved by ``months`` calendar months (negative goes back)."""
    index = day.month - 1 + months
    year, month = day.year + index // 12, index % 12 + 1
    # a day that the target month lacks (Jan 31 -> Feb) is clamped to the month's last day
    last = calendar.monthrange(year, month)[1]
    return date(year, month, min(day.day, last))


def monthly(start, count):
    """``count`` dates one month apart, each computed from ``start`` (no drift)."""
    for offset in range(count):
        yield add_months(start, offset)
