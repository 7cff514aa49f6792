def format_quantity(value, unit, digits=2):
    """``12.5 km``; temperatures get a degree sign (``21.0 °C``), kelvin does not."""
    number = f"{value:.{digits}f}"
    if unit in ("C", "F"):
        return f"{number} °{unit}"
    return f"{number} {unit}"
