import pytest

from miniini import dumps, get_bool, get_int, get_list, loads


def test_typed_getters():
    config = loads("[app]\nworkers = 4\ndebug = off\nhosts = a, b ,c\n")
    assert get_int(config, "app", "workers") == 4
    assert get_bool(config, "app", "debug") is False
    assert get_list(config, "app", "hosts") == ["a", "b", "c"]
    assert get_int(config, "app", "missing", default=7) == 7
    with pytest.raises(KeyError):
        get_int(config, "app", "missing")


def test_bad_boolean():
    with pytest.raises(ValueError):
        get_bool(loads("[a]\nflag = maybe\n"), "a", "flag")


def test_round_trip():
    config = {"": {"name": "demo"}, "server": {"host": "example.org", "port": "8080"}}
    assert loads(dumps(config)) == config
