"""``python -m romanum.cli 1994 XLII``: convert each argument the other way."""
import sys

from romanum.errors import RomanError
from romanum.numerals import from_roman, to_roman


def convert(argument):
    if argument.isdigit():
        return to_roman(int(argument))
    return str(from_roman(argument))


def main(argv=None):
    status = 0
    for argument in sys.argv[1:] if argv is None else argv:
        try:
            print(convert(argument))
        except RomanError as error:
            print(f"error: {error}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
