import pytest

from semverlite import InvalidVersion, max_satisfying, satisfies


@pytest.mark.parametrize("version, spec, expected", [
    ("1.4.2", ">=1.2.0 <2.0.0", True),
    ("2.0.0", ">=1.2.0 <2.0.0", False),
    ("1.9.9", "^1.2.3", True),
    ("2.0.0", "^1.2.3", False),
    ("0.2.5", "^0.2.3", True),
    ("0.3.0", "^0.2.3", False),
    ("1.2.9", "~1.2.3", True),
    ("1.3.0", "~1.2.3", False),
    ("1.2.3", "1.2.3", True),
])
def test_satisfies(version, spec, expected):
    assert satisfies(version, spec) is expected


def test_empty_range():
    with pytest.raises(InvalidVersion):
        satisfies("1.0.0", "  ")


def test_max_satisfying():
    assert max_satisfying(["1.2.0", "1.4.1", "2.0.0", "1.3.9"], "^1.2.0") == "1.4.1"
    assert max_satisfying(["3.0.0"], "^1.2.0") is None
