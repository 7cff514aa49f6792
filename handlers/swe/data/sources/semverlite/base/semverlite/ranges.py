"""Range expressions: space-separated comparators (``>=1.2.0 <2.0.0``), ``^1.2.3`` and ``~1.2.3``."""
import operator

from semverlite.version import InvalidVersion, Version

_OPERATORS = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "=": operator.eq,
}


def _comparators(spec):
    for token in spec.split():
        if token.startswith("^"):
            low = Version.parse(token[1:])
            high = low.bump("major") if low.major else low.bump("minor")
            yield operator.ge, low
            yield operator.lt, high
        elif token.startswith("~"):
            low = Version.parse(token[1:])
            yield operator.ge, low
            yield operator.lt, low.bump("minor")
        else:
            for symbol in sorted(_OPERATORS, key=len, reverse=True):
                if token.startswith(symbol):
                    yield _OPERATORS[symbol], Version.parse(token[len(symbol):])
                    break
            else:
                yield operator.eq, Version.parse(token)


def satisfies(version, spec):
    """True when ``version`` matches every comparator of ``spec``."""
    if isinstance(version, str):
        version = Version.parse(version)
    comparators = list(_comparators(spec))
    if not comparators:
        raise InvalidVersion(f"empty range {spec!r}")
    return all(check(version, bound) for check, bound in comparators)


def max_satisfying(versions, spec):
    """The highest of ``versions`` that satisfies ``spec``, or None."""
    matching = [Version.parse(v) if isinstance(v, str) else v for v in versions]
    matching = [v for v in matching if satisfies(v, spec)]
    return str(max(matching)) if matching else None
