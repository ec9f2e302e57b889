"""dpcost.core's command-line number parsers: the one place every CLI reads its digits."""

import subprocess
import sys

import pytest

from dpcost.core import parse_decimal, parse_whole_number

NOT_ASCII = ["١٢", "８", "٨", "8_0", " 8", "+8", "8.", "0x8", ""]


@pytest.mark.parametrize("text", NOT_ASCII)
def test_whole_numbers_take_ascii_digits_only(text):
    with pytest.raises(ValueError, match=r"^--n must be a whole number in digits 0-9"):
        parse_whole_number(text, "--n", 1, 100)


@pytest.mark.parametrize("text, message", [
    ("0", "at least 1, got 0"), ("-3", "at least 1, got '-3'"), ("101", "at most 100, got 101"),
    ("9" * 100_000, "at most 100, got a number of 100000 digits"),
])
def test_whole_numbers_are_bounded(text, message):
    with pytest.raises(ValueError, match=message):
        parse_whole_number(text, "--n", 1, 100)


def test_leading_zeros_are_fine_however_many():
    assert parse_whole_number("0" * 10_000 + "7", "--n", 1, 100) == 7


@pytest.mark.parametrize("text, value", [("4", 4.0), ("2.5", 2.5), (".5", 0.5), ("4e6", 4e6),
                                         ("1E-3", 1e-3), ("+3", 3.0)])
def test_decimals(text, value):
    assert parse_decimal(text, "--x", 0) == value


@pytest.mark.parametrize("text, message", [
    ("４", "digits 0-9"), ("٢.٥", "digits 0-9"), ("1_0", "digits 0-9"), ("0x1p3", "digits 0-9"),
    ("inf", "finite"), ("-Infinity", "finite"), ("nan", "finite"), ("1e999", "finite"),
    ("-1", "at least 0.25 (why), got '-1'"), ("0.1", "at least 0.25 (why)"),
])
def test_bad_decimals_name_the_parameter(text, message):
    with pytest.raises(ValueError, match=r"^--x must be") as caught:
        parse_decimal(text, "--x", 0.25, minimum_why=" (why)")
    assert message in str(caught.value)


def test_a_value_finite_in_mb_but_not_in_bytes_is_refused():
    assert parse_decimal("1e300", "--model-mb", 0, scale=1e6) == 1e300
    with pytest.raises(ValueError, match=r"--model-mb must be a finite number \(bytes beyond"):
        parse_decimal("1.7e308", "--model-mb", 0, scale=1e6, unit="bytes")


@pytest.mark.parametrize("command, flag", [
    (["dpcost", "--model-size", "1GB", "--gpus"], "--gpus"),
    (["dpcost.measure", "--world-size"], "--world-size"),
    (["dpcost.measure", "--steps"], "--steps"),
])
@pytest.mark.parametrize("digits", ["١٢", "８"])
def test_both_clis_refuse_the_same_digits(command, flag, digits):
    result = subprocess.run([sys.executable, "-m", *command, digits], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert f"{flag} must be a whole number in digits 0-9, got '{digits}'" in result.stderr
