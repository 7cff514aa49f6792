"""Inclusive date ranges and calendar month arithmetic."""
from dateranges.months import add_months, month_end, monthly
from dateranges.ranges import DateRange

__all__ = ["DateRange", "add_months", "month_end", "monthly"]
