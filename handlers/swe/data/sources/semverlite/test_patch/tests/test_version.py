import pytest

from semverlite import InvalidVersion, Version, compare


def test_parse_and_str():
    version = Version.parse("1.2.3-beta.1+build.5")
    assert (version.major, version.minor, version.patch) == (1, 2, 3)
    assert version.prerelease == ("beta", "1")
    assert version.build == ("build", "5")
    assert str(version) == "1.2.3-beta.1+build.5"


@pytest.mark.parametrize("bad", ["1.2", "01.2.3", "1.2.3-", "1.2.3-01", "v1.2.3", "", None])
def test_invalid(bad):
    with pytest.raises(InvalidVersion):
        Version.parse(bad)


def test_core_ordering():
    assert Version.parse("1.2.3") < Version.parse("1.2.4") < Version.parse("1.3.0") < Version.parse("2.0.0")
    assert compare("1.10.0", "1.9.0") == 1


def test_prerelease_ranks_below_release():
    assert Version.parse("1.0.0-alpha") < Version.parse("1.0.0")
    assert compare("1.0.0", "1.0.0-rc.1") == 1


def test_spec_example_ordering():
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta",
               "1.0.0-beta.2", "1.0.0-rc.1", "1.0.0"]
    assert sorted(reversed(ordered), key=Version.parse) == ordered


def test_build_metadata_is_ignored():
    assert Version.parse("1.0.0+a") == Version.parse("1.0.0+b")
    assert len({Version.parse("1.0.0+a"), Version.parse("1.0.0")}) == 1


def test_bump():
    assert str(Version.parse("1.2.3-rc.1").bump("minor")) == "1.3.0"
    with pytest.raises(ValueError):
        Version.parse("1.2.3").bump("micro")


def test_numeric_prerelease_identifiers_compare_as_integers():
    assert Version.parse("1.0.0-alpha.2") < Version.parse("1.0.0-alpha.10")
    assert sorted(["1.0.0-rc.11", "1.0.0-rc.9"], key=Version.parse) == ["1.0.0-rc.9", "1.0.0-rc.11"]


def test_max_satisfying_with_many_release_candidates():
    from semverlite import max_satisfying
    candidates = [f"2.0.0-rc.{n}" for n in range(1, 13)]
    assert max_satisfying(candidates, ">=2.0.0-rc.1") == "2.0.0-rc.12"
