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
