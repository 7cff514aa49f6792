"""The one entry point: ``convert(value, from_unit, to_unit)``."""
from unitconv import temperature
from unitconv.units import LENGTH, MASS, canonical, dimension


class UnknownUnit(ValueError):
    pass


class IncompatibleUnits(ValueError):
    pass


def convert(value, from_unit, to_unit):
    source, target = canonical(from_unit), canonical(to_unit)
    for given, name in ((from_unit, source), (to_unit, target)):
        if name is None:
            raise UnknownUnit(f"unknown unit {given!r}")
    if dimension(source) != dimension(target):
        raise IncompatibleUnits(f"cannot convert {dimension(source)} ({from_unit}) to "
                                f"{dimension(target)} ({to_unit})")
    if dimension(source) == "temperature":
        return temperature.from_kelvin(temperature.to_kelvin(value, source), target)
    table = LENGTH if dimension(source) == "length" else MASS
    return value * table[source] / table[target]
