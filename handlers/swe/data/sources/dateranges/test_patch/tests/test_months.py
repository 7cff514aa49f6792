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


def test_add_months_clamps_to_the_end_of_the_month():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)
    assert add_months(date(2024, 5, 31), -1) == date(2024, 4, 30)


def test_monthly_from_the_31st():
    assert list(monthly(date(2023, 8, 31), 3)) == [date(2023, 8, 31), date(2023, 9, 30), date(2023, 10, 31)]
