"""Conversion between integers and Roman numerals (1..3999, standard subtractive form)."""
import re

from romanum.errors import RomanError

# (value, symbol) pairs from the largest down, subtractive pairs included, so that a greedy
# walk over the table writes the standard form.
_TABLE = (
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
)

_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}

_VALID = re.compile(r"^M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})$")


def to_roman(number):
    """Return the Roman numeral for ``number`` (an int from 1 to 3999)."""
    if not isinstance(number, int) or isinstance(number, bool):
        raise RomanError(f"expected an integer, got {number!r}")
    if not 0 < number < 4000:
        raise RomanError(f"{number} is out of range (1..3999)")
    parts = []
    for value, symbol in _TABLE:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)


def is_roman(text):
    """True when ``text`` is a well-formed numeral (case-insensitive)."""
    return isinstance(text, str) and bool(text) and _VALID.match(text.upper()) is not None


def from_roman(text):
    """Return the integer value of a well-formed Roman numeral."""
    if not is_roman(text):
        raise RomanError(f"{text!r} is not a valid Roman numeral")
    total = 0
    largest = 0
    for char in reversed(text.upper()):
        value = _VALUES[char]
        if value < largest:
            total -= value
        else:
            total += value
            largest = value
    return total
