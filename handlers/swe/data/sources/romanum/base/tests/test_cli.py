from romanum.cli import main


def test_converts_both_ways(capsys):
    assert main(["42", "MMXXIV"]) == 0
    assert capsys.readouterr().out.split() == ["XLII", "2024"]


def test_reports_bad_input(capsys):
    assert main(["IIII"]) == 1
    assert "not a valid Roman numeral" in capsys.readouterr().err
