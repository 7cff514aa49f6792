from dialects import Dialect, read_rows


def test_read_with_sniffed_dialect():
    header, rows = read_rows("name;age\nann;31\nbob;27")
    assert header == ["name", "age"]
    assert rows == [["ann", "31"], ["bob", "27"]]


def test_read_with_given_dialect():
    header, rows = read_rows("1|2\n3|4\n", dialect=Dialect(delimiter="|"))
    assert header is None
    assert rows == [["1", "2"], ["3", "4"]]


def test_read_file_content_with_trailing_newline():
    header, rows = read_rows("name;age\r\nann;31\r\nbob;27\r\n")
    assert header == ["name", "age"]
    assert rows == [["ann", "31"], ["bob", "27"]]
