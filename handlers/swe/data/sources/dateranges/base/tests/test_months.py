from datetime import date

from dateranges import add_months, month_end, monthly


def test_add_months_forward_and_back():
    assert add_months(date(2024, 3, 15), 1) == date(2024, 4, 15)
    assert add_months(date(2024, 11, 5), 3) == date(2025, 2, 5)
    assert add_months(date(2024, 3, 15), -3) == date(2023, 12, 15)
    assert add_months(date(2024, 3, 15), 0) == date(2024, 3, 15)


def test_month_end():
    assert month_end(date(2024, 2, 10)) == date(2024, 2, 29)
    assert month_end(date(2023, 2, 10)) == date(2023, 2, 28)


def test_monthly_mid_month():
    assert list(monthly(date(2024, 10, 15), 3)) == [date(2024, 10, 15), date(2024, 11, 15), date(2024, 12, 15)]
