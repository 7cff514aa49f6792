from unitconv import format_quantity


def test_format():
    assert format_quantity(12.5, "km") == "12.50 km"
    assert format_quantity(21, "C", digits=1) == "21.0 °C"
    assert format_quantity(300, "K", digits=0) == "300 K"
