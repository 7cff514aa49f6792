"""Temperatures are affine, not linear: they go through kelvin with an offset."""


def to_kelvin(value, unit):
    if unit == "K":
        return value
    if unit == "C":
        return value + 273.15
    if unit == "F":
        return (value - 32) * 5 / 9 + 273.15
    raise ValueError(f"not a temperature unit: {unit!r}")


def from_kelvin(value, unit):
    if unit == "K":
        return value
    if unit == "C":
        return value - 273.15
    if unit == "F":
        return (value - 273.15) * 9 / 5 + 32
    raise ValueError(f"not a temperature unit: {unit!r}")
