import pytest

from miniini import ParseError, loads

SAMPLE = """
; global settings
name = demo

[server]
Host = example.org
port: 8080
motd = "Hello, world"

# the database
[db]
path = /var/lib/demo.db
"""


def test_sections_and_keys():
    config = loads(SAMPLE)
    assert config[""] == {"name": "demo"}
    assert config["server"] == {"host": "example.org", "port": "8080", "motd": "Hello, world"}
    assert config["db"]["path"] == "/var/lib/demo.db"


def test_repeated_section_and_key():
    config = loads("[a]\nx = 1\n[b]\ny = 2\n[a]\nx = 3\nz = 4\n")
    assert config == {"a": {"x": "3", "z": "4"}, "b": {"y": "2"}}


@pytest.mark.parametrize("text, lineno", [
    ("[server\nx = 1\n", 1),
    ("[a]\njust a line\n", 2),
    ("[]\n", 1),
    ("[a]\n= value\n", 2),
])
def test_errors_carry_the_line(text, lineno):
    with pytest.raises(ParseError) as raised:
        loads(text)
    assert raised.value.lineno == lineno
    assert f"line {lineno}" in str(raised.value)


def test_values_may_contain_separators():
    config = loads("[server]\nurl = https://example.org/search?q=ini&page=2\ntoken = c2VjcmV0==\n"
                   "time: 12:30\n")
    assert config["server"] == {"url": "https://example.org/search?q=ini&page=2",
                                "token": "c2VjcmV0==", "time": "12:30"}


def test_round_trip_of_values_with_equals():
    from miniini import dumps
    config = {"db": {"dsn": "host=localhost port=5432"}}
    assert loads(dumps(config)) == config
