import pytest

from unitconv import IncompatibleUnits, UnknownUnit, convert


def test_length():
    assert convert(1, "km", "m") == 1000
    assert convert(12, "in", "ft") == pytest.approx(1.0)
    assert convert(5, "km", "mi") == pytest.approx(3.10686, rel=1e-5)


def test_mass():
    assert convert(1, "lb", "g") == pytest.approx(453.59237)
    assert convert(16, "oz", "pound") == pytest.approx(1.0)


def test_celsius_and_kelvin():
    assert convert(0, "C", "K") == pytest.approx(273.15)
    assert convert(300, "kelvin", "celsius") == pytest.approx(26.85)


def test_to_fahrenheit():
    assert convert(100, "C", "F") == pytest.approx(212)
    assert convert(-40, "degC", "degF") == pytest.approx(-40)
    assert convert(273.15, "K", "F") == pytest.approx(32)


def test_unknown_unit():
    with pytest.raises(UnknownUnit, match="parsec"):
        convert(1, "parsec", "m")


def test_incompatible_units():
    with pytest.raises(IncompatibleUnits):
        convert(1, "kg", "m")


def test_from_fahrenheit():
    assert convert(212, "F", "C") == pytest.approx(100)
    assert convert(32, "fahrenheit", "K") == pytest.approx(273.15)
    assert convert(-40, "degF", "degC") == pytest.approx(-40)


@pytest.mark.parametrize("celsius", [-273.15, -40, 0, 36.6, 100])
def test_fahrenheit_round_trip(celsius):
    assert convert(convert(celsius, "C", "F"), "F", "C") == pytest.approx(celsius)
