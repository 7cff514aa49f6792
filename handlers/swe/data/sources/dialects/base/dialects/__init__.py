"""CSV dialect sniffing."""
from dialects.reader import read_rows
from dialects.sniffer import CANDIDATES, Dialect, sniff

__all__ = ["CANDIDATES", "Dialect", "read_rows", "sniff"]
