from lrukit import lru_cached


def test_memoises():
    calls = []

    @lru_cached(capacity=8)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(3), square(3), square(4)] == [9, 9, 16]
    assert calls == [3, 4]
    assert square.cache.stats.hits == 1
    assert square.__name__ == "square"


def test_keyword_arguments_are_part_of_the_key():
    @lru_cached()
    def power(x, exponent=2):
        return x ** exponent

    assert power(2) == 4
    assert power(2, exponent=3) == 8
