"""Word wrapping and simple text layout."""
from wraptext.layout import columns, indent, shorten
from wraptext.wrap import fill, wrap

__all__ = ["columns", "fill", "indent", "shorten", "wrap"]
