class RomanError(ValueError):
    """Raised for numbers that have no Roman form and for malformed numerals."""
