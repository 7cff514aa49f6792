"""Roman numeral conversion."""
from romanum.errors import RomanError
from romanum.numerals import from_roman, is_roman, to_roman

__all__ = ["RomanError", "from_roman", "is_roman", "to_roman"]
__version__ = "1.2.0"
