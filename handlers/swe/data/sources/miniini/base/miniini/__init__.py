"""A tiny INI reader and writer."""
from miniini.errors import ParseError
from miniini.getters import get_bool, get_int, get_list
from miniini.parser import loads
from miniini.writer import dumps

__all__ = ["ParseError", "dumps", "get_bool", "get_int", "get_list", "loads"]
