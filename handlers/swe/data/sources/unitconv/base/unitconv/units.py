"""Linear units: the factor that turns one of the unit into the dimension's base unit."""

LENGTH = {  # base: metre
    "m": 1.0,
    "km": 1000.0,
    "cm": 0.01,
    "mm": 0.001,
    "in": 0.0254,
    "ft": 0.3048,
    "yd": 0.9144,
    "mi": 1609.344,
}

MASS = {  # base: kilogram
    "kg": 1.0,
    "g": 0.001,
    "mg": 1e-6,
    "t": 1000.0,
    "lb": 0.45359237,
    "oz": 0.028349523125,
}

TEMPERATURE = ("K", "C", "F")

ALIASES = {
    "meter": "m", "metre": "m", "kilometer": "km", "mile": "mi", "inch": "in", "foot": "ft",
    "gram": "g", "kilogram": "kg", "pound": "lb", "ounce": "oz",
    "kelvin": "K", "celsius": "C", "degC": "C", "fahrenheit": "F", "degF": "F",
}


def canonical(unit):
    """The table name of ``unit`` (aliases resolved), or None when it is unknown."""
    unit = ALIASES.get(unit, ALIASES.get(unit.lower(), unit))
    if unit in LENGTH or unit in MASS or unit in TEMPERATURE:
        return unit
    return None


def dimension(unit):
    if unit in LENGTH:
        return "length"
    if unit in MASS:
        return "mass"
    return "temperature"
