from datetime import date

import pytest

from dateranges import DateRange


def test_length_and_membership():
    march = DateRange(date(2024, 3, 1), date(2024, 3, 31))
    assert len(march) == 31
    assert date(2024, 3, 31) in march and date(2024, 4, 1) not in march


def test_days_with_step():
    week = DateRange(date(2024, 1, 1), date(2024, 1, 7))
    assert list(week.days(step=3)) == [date(2024, 1, 1), date(2024, 1, 4), date(2024, 1, 7)]
    assert len(list(week)) == 7


def test_overlap_and_intersection():
    a = DateRange(date(2024, 1, 1), date(2024, 1, 10))
    b = DateRange(date(2024, 1, 10), date(2024, 1, 20))
    c = DateRange(date(2024, 2, 1), date(2024, 2, 2))
    assert a.overlaps(b) and not a.overlaps(c)
    assert a.intersection(b) == DateRange(date(2024, 1, 10), date(2024, 1, 10))
    assert a.intersection(c) is None


def test_parse_and_validation():
    assert DateRange.parse("2024-03-01 .. 2024-03-05") == DateRange(date(2024, 3, 1), date(2024, 3, 5))
    with pytest.raises(ValueError):
        DateRange.parse("2024-03-01")
    with pytest.raises(ValueError):
        DateRange(date(2024, 3, 2), date(2024, 3, 1))
