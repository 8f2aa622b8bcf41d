"""``textkit``: small string helpers. Bug: ``truncate`` returns strings longer than ``width``."""

from bpo_envs.swebench.bundled.spec import Commit, RepoSource

PYPROJECT = '''[project]
name = "textkit"
version = "0.3.0"
description = "Small string helpers"
requires-python = ">=3.8"
'''

SLUG = '''"""URL slugs."""

import re
import unicodedata

_NON_WORD = re.compile(r"[^a-z0-9]+")


def slugify(text, sep="-"):
    """Lower-case ASCII slug of ``text``: runs of other characters become ``sep``."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return _NON_WORD.sub(sep, ascii_text.lower()).strip(sep)
'''

SLUG_TESTS = '''from textkit import slugify


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_accents():
    assert slugify("Crème brûlée") == "creme-brulee"


def test_slugify_separator():
    assert slugify("a b  c", sep="_") == "a_b_c"
'''

SHORTEN_BUGGY = '''"""Shortening text for display."""


def truncate(text, width, placeholder="..."):
    """Return ``text`` cut to at most ``width`` characters, ending in ``placeholder`` when cut."""
    if width < 0:
        raise ValueError("width must be >= 0")
    if len(text) <= width:
        return text
    return text[:width] + placeholder


def shorten_words(text, width, placeholder="..."):
    """Like :func:`truncate` but never cuts inside a word."""
    if len(text) <= width:
        return text
    words = text.split()
    out = ""
    for word in words:
        candidate = (out + " " + word).strip()
        if len(candidate) + len(placeholder) > width:
            break
        out = candidate
    return out + placeholder
'''

SHORTEN_FIXED = SHORTEN_BUGGY.replace(
    '''    return text[:width] + placeholder
''',
    '''    if width <= len(placeholder):
        return placeholder[:width]
    return text[: width - len(placeholder)] + placeholder
''',
)

SHORTEN_TESTS = '''from textkit import shorten_words, truncate


def test_truncate_short_text_unchanged():
    assert truncate("abc", 5) == "abc"


def test_truncate_negative_width():
    import pytest

    with pytest.raises(ValueError):
        truncate("abc", -1)


def test_shorten_words():
    assert shorten_words("the quick brown fox", 12) == "the quick..."
'''

SHORTEN_TESTS_NEW = SHORTEN_TESTS + '''

def test_truncate_respects_width():
    out = truncate("abcdefghij", 6)
    assert out == "abc..."
    assert len(out) == 6


def test_truncate_width_smaller_than_placeholder():
    assert truncate("abcdefghij", 2) == ".."
'''

INIT_V1 = '''"""textkit: small string helpers."""

from textkit.slug import slugify

__all__ = ["slugify"]
'''

INIT_V2 = '''"""textkit: small string helpers."""

from textkit.shorten import shorten_words, truncate
from textkit.slug import slugify

__all__ = ["shorten_words", "slugify", "truncate"]
__version__ = "0.3.0"
'''

README_V1 = "# textkit\n\nSmall string helpers.\n"
README_V2 = README_V1 + '''
## Usage

```python
>>> from textkit import slugify, truncate
>>> slugify("Hello, World!")
'hello-world'
>>> truncate("a long sentence", 8)
'a lon...'
```
'''

GITIGNORE = "__pycache__/\n*.pyc\n.pytest_cache/\n"

REPO = RepoSource(
    name="textkit",
    version="0.3",
    commits=(
        Commit(
            "Initial commit: slugify",
            {
                "README.md": README_V1,
                "pyproject.toml": PYPROJECT,
                ".gitignore": GITIGNORE,
                "textkit/__init__.py": INIT_V1,
                "textkit/slug.py": SLUG,
                "tests/test_slug.py": SLUG_TESTS,
            },
        ),
        Commit(
            "Add truncate() and shorten_words()",
            {
                "textkit/__init__.py": INIT_V2,
                "textkit/shorten.py": SHORTEN_BUGGY,
                "tests/test_shorten.py": SHORTEN_TESTS,
            },
        ),
        Commit("README: usage examples", {"README.md": README_V2}),
    ),
    fix={"textkit/shorten.py": SHORTEN_FIXED},
    tests={"tests/test_shorten.py": SHORTEN_TESTS_NEW},
    problem_statement='''truncate() returns strings longer than the requested width

`truncate(text, width)` is documented to return at most `width` characters, but when
the text is cut the placeholder is appended after `width` characters of text:

```python
>>> from textkit import truncate
>>> truncate("abcdefghij", 6)
'abcdef...'
>>> len(_)
9
```

Expected `'abc...'` (6 characters). When `width` is smaller than the placeholder the
result should be the placeholder cut to `width`.
''',
    fail_to_pass=(
        "tests/test_shorten.py::test_truncate_respects_width",
        "tests/test_shorten.py::test_truncate_width_smaller_than_placeholder",
    ),
    pass_to_pass=(
        "tests/test_shorten.py::test_truncate_short_text_unchanged",
        "tests/test_shorten.py::test_truncate_negative_width",
        "tests/test_shorten.py::test_shorten_words",
    ),
)
