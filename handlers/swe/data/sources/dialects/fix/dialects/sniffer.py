"""Guess delimiter, quote character and header presence from a sample of CSV text.

The delimiter is the candidate that occurs the same, non-zero number of times on every line
(outside quotes), preferring the most frequent one; with no consistent candidate it is ','.
"""
from dataclasses import dataclass

CANDIDATES = (",", ";", "\t", "|")


@dataclass(frozen=True)
class Dialect:
    delimiter: str = ","
    quotechar: str = '"'
    has_header: bool = False


def _count_outside_quotes(line, char, quotechar):
    count, quoted = 0, False
    for c in line:
        if c == quotechar:
            quoted = not quoted
        elif c == char and not quoted:
            count += 1
    return count


def _quotechar(sample):
    return "'" if sample.count("'") > sample.count('"') else '"'


def _delimiter(lines, quotechar):
    best, best_count = ",", 0
    for candidate in CANDIDATES:
        counts = {_count_outside_quotes(line, candidate, quotechar) for line in lines}
        if len(counts) == 1:
            count = counts.pop()
            if count > best_count:
                best, best_count = candidate, count
    return best


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _has_header(rows):
    """A header row has no numbers, in a column that is numeric on every other row."""
    if len(rows) < 2:
        return False
    header, body = rows[0], rows[1:]
    for column, title in enumerate(header):
        values = [row[column] for row in body if column < len(row)]
        if values and all(_is_number(v) for v in values) and not _is_number(title):
            return True
    return False


def _split(line, delimiter, quotechar):
    fields, field, quoted = [], "", False
    for c in line:
        if c == quotechar:
            quoted = not quoted
        elif c == delimiter and not quoted:
            fields.append(field.strip())
            field = ""
        else:
            field += c
    fields.append(field.strip())
    return fields


def sniff(sample):
    """The most likely ``Dialect`` of ``sample`` (a few lines of CSV text)."""
    # blank lines (a trailing newline) carry no delimiters; splitlines handles \r\n and \r
    lines = [line for line in sample.splitlines() if line.strip()]
    quotechar = _quotechar(sample)
    delimiter = _delimiter(lines, quotechar)
    rows = [_split(line, delimiter, quotechar) for line in lines]
    return Dialect(delimiter=delimiter, quotechar=quotechar, has_header=_has_header(rows))
