import math
import time

import hypothesis_profile  # noqa: F401 - derandomized, before any @given
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpcost import units
from dpcost.units import MAX_SIZE_TEXT, format_bytes, parse_size


@pytest.mark.parametrize("text, expected", [
    ("1000", 1000), ("1.5GB", 1.5e9), ("1.5 GB", 1.5e9), ("350MB", 350e6), ("4kB", 4000),
    ("4KB", 4000), ("2TB", 2e12), ("512MiB", 512 * 2**20), ("1KiB", 1024), ("3GiB", 3 * 2**30),
    ("1TiB", 2**40), ("4e6", 4e6), ("0", 0), ("12B", 12), (".5MB", 5e5), ("1.5gb", 1.5e9),
])
def test_parse_size(text, expected):
    assert math.isclose(parse_size(text), expected)


@pytest.mark.parametrize("value, binary, expected", [
    (0, False, "0 B"), (999, False, "999 B"), (1000, False, "1 kB"), (2.625e9, False, "2.625 GB"),
    (21e9, False, "21 GB"), (1024, True, "1 KiB"), (3 * 2**30, True, "3 GiB"),
    (93e9, False, "93 GB"), (2.90625e9, False, "2.906 GB"), (1.5e9, True, "1.397 GiB"),
])
def test_format_bytes(value, binary, expected):
    assert format_bytes(value, binary=binary) == expected


# The edges (issue 9, section 4).
def test_parse_size_refuses_long_text_at_once_and_names_the_limit():
    for text in ["0" * 32_000 + "!", "0" * 100_000 + "!", "1" * 100_000, " " * 99_999 + "1"]:
        start = time.perf_counter()
        with pytest.raises(ValueError) as info:
            parse_size(text)
        assert time.perf_counter() - start < 0.5
        assert "size" in str(info.value) and len(str(info.value)) < 200  # not the whole text


def test_parse_size_limit_is_exact():
    assert MAX_SIZE_TEXT == 64
    assert parse_size(" " * 59 + "1.5GB") == 1.5e9  # 64 characters
    with pytest.raises(ValueError):
        parse_size(" " * 60 + "1.5GB")


def test_size_pattern_is_linear():
    # Apart from the length bound: the old pattern [0-9]*\.?[0-9]+ split a run of digits every
    # way before failing (32,000 digits and "!" took 23.6 s); 20,000 would take about 9 s.
    start = time.perf_counter()
    assert units._SIZE_PATTERN.fullmatch("0" * 20_000 + "!") is None
    assert units._SIZE_PATTERN.fullmatch("0" * 20_000 + ".0" * 10_000 + "!") is None
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("text, error", [
    *[(text, ValueError) for text in [
        "", "GB", "1.5XB", "1,5GB", "abc", "1 G B", "inf", "1e400GB",  # not a size
        "-1GB", " -3 MB", "-.5", "-0",  # negative
        "١٢٣", "８", "8_0", "1\u2003GB", "1\u00a0GB"]],  # not ASCII digits and spaces
    (1.5, TypeError),
])
def test_bad_input_names_the_parameter(text, error):
    with pytest.raises(error) as info:
        parse_size(text)
    assert "size" in str(info.value)


@given(st.text(alphabet="0123456789.eE+-_ kKMGTiB!١８\u2003", max_size=80))
def test_parse_size_answers_a_float_or_a_value_error(text):
    try:
        value = parse_size(text)
    except ValueError as exc:
        assert "size" in str(exc)
    else:
        assert type(value) is float and math.isfinite(value) and value >= 0
        assert len(text) <= MAX_SIZE_TEXT and text.isascii()
