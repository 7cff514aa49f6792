"""Unit conversion for lengths, masses and temperatures."""
from unitconv.convert import IncompatibleUnits, UnknownUnit, convert
from unitconv.format import format_quantity

__all__ = ["IncompatibleUnits", "UnknownUnit", "convert", "format_quantity"]
