import pytest

from romanum import RomanError, from_roman, is_roman, to_roman


@pytest.mark.parametrize("number, numeral", [
    (1, "I"), (3, "III"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"),
    (400, "CD"), (2024, "MMXXIV"), (3888, "MMMDCCCLXXXVIII"),
])
def test_to_roman(number, numeral):
    assert to_roman(number) == numeral


@pytest.mark.parametrize("numeral, number", [
    ("I", 1), ("iv", 4), ("XLII", 42), ("XC", 90), ("CM", 900), ("MCMXCIV", 1994), ("MMMCMXCIX", 3999),
])
def test_from_roman(numeral, number):
    assert from_roman(numeral) == number


@pytest.mark.parametrize("bad", [0, -1, 4000, 2.5, "12", True])
def test_to_roman_rejects(bad):
    with pytest.raises(RomanError):
        to_roman(bad)


@pytest.mark.parametrize("bad", ["", "IIII", "VX", "MMMM", "ABC", None])
def test_from_roman_rejects(bad):
    with pytest.raises(RomanError):
        from_roman(bad)
    assert not is_roman(bad)


def test_round_trip_below_five_hundred():
    for number in range(1, 500):
        assert from_roman(to_roman(number)) == number
