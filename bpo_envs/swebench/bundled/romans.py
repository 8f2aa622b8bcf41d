"""``romans``: Roman numerals, with a long test log. Bug: ``to_roman`` accepts 0 and 4000+.

Its suite is 1,211 tests (a round trip for every number 1..1200 among them), so the grading
log holds over a thousand ``PASSED`` lines: like real Verified rows (django, sympy, astropy
list hundreds of PASS_TO_PASS tests), it is graded from the whole log, not an observation's
head and tail.
"""

from bpo_envs.swebench.bundled.spec import Commit, RepoSource

ROUND_TRIP = 1200
"""Numbers 1..ROUND_TRIP each get a round-trip test (``test_round_trip[n]``)."""

CONVERT_V1 = '''"""Integers to Roman numerals and back (standard subtractive form, 1..3999)."""

_SYMBOLS = (
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
)


def to_roman(number):
    """The Roman numeral of ``number``."""
    if not isinstance(number, int) or isinstance(number, bool):
        raise TypeError(f"not an integer: {number!r}")
    out = []
    for value, symbol in _SYMBOLS:
        count, number = divmod(number, value)
        out.append(symbol * count)
    return "".join(out)


def from_roman(text):
    """The integer a Roman numeral in standard form stands for."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"not a Roman numeral: {text!r}")
    number, rest = 0, text.upper()
    for value, symbol in _SYMBOLS:
        while rest.startswith(symbol):
            number += value
            rest = rest[len(symbol):]
    if rest or to_roman(number) != text.upper():
        raise ValueError(f"not a Roman numeral in standard form: {text!r}")
    return number
'''

CONVERT_FIXED = CONVERT_V1.replace(
    '''        raise TypeError(f"not an integer: {number!r}")
''',
    '''        raise TypeError(f"not an integer: {number!r}")
    if not 1 <= number <= 3999:
        raise ValueError(f"Roman numerals stand for 1..3999, not {number}")
''',
)

INIT = '''"""romans: Roman numerals."""

from romans.convert import from_roman, to_roman

__all__ = ["from_roman", "to_roman"]
'''

TESTS_V1 = f'''import pytest

from romans import from_roman, to_roman


@pytest.mark.parametrize("number", range(1, {ROUND_TRIP + 1}))
def test_round_trip(number):
    assert from_roman(to_roman(number)) == number


def test_known_values():
    assert [to_roman(n) for n in (1, 4, 9, 14, 40, 90, 400, 1994, 3999)] == [
        "I", "IV", "IX", "XIV", "XL", "XC", "CD", "MCMXCIV", "MMMCMXCIX"]


def test_lower_case_is_read():
    assert from_roman("mcmxciv") == 1994


def test_non_standard_form_is_rejected():
    for text in ("IIII", "VV", "IC", "MCMC"):
        with pytest.raises(ValueError):
            from_roman(text)


def test_garbage_is_rejected():
    for text in ("", "ABC", "X1"):
        with pytest.raises(ValueError):
            from_roman(text)


def test_not_a_string_is_rejected():
    with pytest.raises(ValueError):
        from_roman(12)


def test_float_is_rejected():
    with pytest.raises(TypeError):
        to_roman(3.0)


def test_bool_is_rejected():
    with pytest.raises(TypeError):
        to_roman(True)


def test_largest():
    assert to_roman(3999) == "MMMCMXCIX"


def test_smallest():
    assert to_roman(1) == "I"
'''

TESTS_NEW = TESTS_V1 + '''

def test_zero_and_negative_are_rejected():
    for number in (0, -1, -3999):
        with pytest.raises(ValueError):
            to_roman(number)


def test_4000_and_more_are_rejected():
    for number in (4000, 4001, 10_000):
        with pytest.raises(ValueError):
            to_roman(number)
'''

_NAMED = ("test_known_values", "test_lower_case_is_read", "test_non_standard_form_is_rejected",
          "test_garbage_is_rejected", "test_not_a_string_is_rejected", "test_float_is_rejected",
          "test_bool_is_rejected", "test_largest", "test_smallest")

REPO = RepoSource(
    name="romans",
    version="2.0",
    commits=(
        Commit(
            "romans: to_roman() and from_roman()",
            {
                "README.md": "# romans\n\nRoman numerals: `to_roman(1994) == 'MCMXCIV'` and back.\n",
                "setup.cfg": "[metadata]\nname = romans\nversion = 2.0.0\n",
                ".gitignore": "__pycache__/\n*.pyc\n",
                "romans/__init__.py": INIT,
                "romans/convert.py": CONVERT_V1,
                "tests/test_convert.py": TESTS_V1,
            },
        ),
    ),
    fix={"romans/convert.py": CONVERT_FIXED},
    tests={"tests/test_convert.py": TESTS_NEW},
    problem_statement='''to_roman() accepts numbers that have no Roman numeral

```python
>>> from romans import to_roman
>>> to_roman(0)
''
>>> to_roman(4000)
'MMMM'
```

Roman numerals in standard form stand for 1 to 3999 (and `from_roman("MMMM")` already
rejects the second answer). `to_roman` should raise `ValueError` for anything outside 1..3999.
''',
    fail_to_pass=(
        "tests/test_convert.py::test_zero_and_negative_are_rejected",
        "tests/test_convert.py::test_4000_and_more_are_rejected",
    ),
    pass_to_pass=(
        *(f"tests/test_convert.py::test_round_trip[{n}]" for n in range(1, ROUND_TRIP + 1)),
        *(f"tests/test_convert.py::{name}" for name in _NAMED),
    ),
)
