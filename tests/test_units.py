import math

import pytest

from dpcost.units import format_bytes, parse_size


@pytest.mark.parametrize("text, expected", [
    ("1000", 1000), ("1.5GB", 1.5e9), ("1.5 GB", 1.5e9), ("350MB", 350e6), ("4kB", 4000),
    ("4KB", 4000), ("2TB", 2e12), ("512MiB", 512 * 2**20), ("1KiB", 1024), ("3GiB", 3 * 2**30),
    ("1TiB", 2**40), ("4e6", 4e6), ("0", 0), ("12B", 12), (".5MB", 5e5), ("1.5gb", 1.5e9),
])
def test_parse_size(text, expected):
    assert math.isclose(parse_size(text), expected)


@pytest.mark.parametrize("text", ["", "GB", "1.5XB", "-1GB", "1,5GB", "abc", "1 G B", "inf",
                                  "1e400GB"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_parse_size_wants_a_string():
    with pytest.raises(TypeError):
        parse_size(1.5)


@pytest.mark.parametrize("value, binary, expected", [
    (0, False, "0 B"), (999, False, "999 B"), (1000, False, "1 kB"), (2.625e9, False, "2.625 GB"),
    (21e9, False, "21 GB"), (1024, True, "1 KiB"), (3 * 2**30, True, "3 GiB"),
    (93e9, False, "93 GB"), (2.90625e9, False, "2.906 GB"), (1.5e9, True, "1.397 GiB"),
])
def test_format_bytes(value, binary, expected):
    assert format_bytes(value, binary=binary) == expected
