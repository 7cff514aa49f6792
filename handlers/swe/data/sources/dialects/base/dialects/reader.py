"""Read rows with a sniffed (or given) dialect, through the standard csv module."""
import csv
import io

from dialects.sniffer import sniff


def read_rows(text, dialect=None, sample_size=4096):
    """Rows of ``text`` as lists of strings; the header row, if any, is dropped.

    Returns ``(header, rows)`` where ``header`` is None without a header row.
    """
    dialect = dialect or sniff(text[:sample_size])
    reader = csv.reader(io.StringIO(text), delimiter=dialect.delimiter, quotechar=dialect.quotechar)
    rows = [row for row in reader if row]
    if dialect.has_header and rows:
        return rows[0], rows[1:]
    return None, rows
