"""``inicfg``: a tiny INI reader. Bug: values that contain ``=`` crash the parser."""

from bpo_envs.swebench.bundled.spec import Commit, RepoSource

PARSER_V1 = '''"""Read INI text into ``{section: {key: value}}``."""


class ParseError(ValueError):
    """The text is not valid INI; the message names the line."""


def parse(text):
    """Parse INI ``text``; keys before any section go into section ``""``."""
    data = {"": {}}
    section = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(f"line {lineno}: unclosed section header")
            section = line[1:-1].strip()
            data.setdefault(section, {})
            continue
        if "=" not in line:
            raise ParseError(f"line {lineno}: expected key = value")
        key, value = line.split("=")
        data[section][key.strip().lower()] = value.strip()
    return data
'''

PARSER_V2 = PARSER_V1 + '''

def get_bool(data, section, key, default=False):
    """Read a boolean (``yes/no``, ``true/false``, ``on/off``, ``1/0``)."""
    value = data.get(section, {}).get(key)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in ("yes", "true", "on", "1"):
        return True
    if lowered in ("no", "false", "off", "0"):
        return False
    raise ValueError(f"[{section}] {key}: not a boolean: {value!r}")
'''

PARSER_FIXED = PARSER_V2.replace('line.split("=")', 'line.split("=", 1)')

TESTS_V1 = '''import pytest

from inicfg import ParseError, parse


def test_sections_and_keys():
    data = parse("[server]\\nhost = example.org\\nport = 8080\\n")
    assert data["server"] == {"host": "example.org", "port": "8080"}


def test_comments_and_blank_lines():
    assert parse("# c\\n\\n; c\\n[a]\\nx=1\\n")["a"] == {"x": "1"}


def test_keys_before_section():
    assert parse("name = top\\n")[""] == {"name": "top"}


def test_keys_are_lower_case():
    assert parse("[a]\\nKey = V\\n")["a"] == {"key": "V"}


def test_bad_line():
    with pytest.raises(ParseError, match="line 2"):
        parse("[a]\\nnot a pair\\n")
'''

TESTS_V2 = TESTS_V1 + '''

def test_get_bool():
    from inicfg import get_bool

    data = parse("[f]\\ndebug = yes\\nquiet = off\\n")
    assert get_bool(data, "f", "debug") is True
    assert get_bool(data, "f", "quiet") is False
    assert get_bool(data, "f", "missing", default=True) is True
'''

TESTS_NEW = TESTS_V2 + '''

def test_value_with_equals_sign():
    data = parse("[db]\\nurl = postgres://h/db?sslmode=require\\n")
    assert data["db"]["url"] == "postgres://h/db?sslmode=require"
'''

REPO = RepoSource(
    name="inicfg",
    version="0.2",
    commits=(
        Commit(
            "inicfg: parse()",
            {
                "README.md": "# inicfg\n\nA tiny INI reader.\n",
                "pyproject.toml": '[project]\nname = "inicfg"\nversion = "0.1.0"\n',
                "inicfg/__init__.py": '"""inicfg: a tiny INI reader."""\n\nfrom inicfg.parser import ParseError, parse\n\n__all__ = ["ParseError", "parse"]\n',
                "inicfg/parser.py": PARSER_V1,
                "tests/test_parser.py": TESTS_V1,
            },
        ),
        Commit(
            "Add get_bool()",
            {
                "inicfg/__init__.py": '"""inicfg: a tiny INI reader."""\n\nfrom inicfg.parser import ParseError, get_bool, parse\n\n__all__ = ["ParseError", "get_bool", "parse"]\n',
                "inicfg/parser.py": PARSER_V2,
                "tests/test_parser.py": TESTS_V2,
            },
        ),
        Commit("Bump version to 0.2.0", {"pyproject.toml": '[project]\nname = "inicfg"\nversion = "0.2.0"\n'}),
    ),
    fix={"inicfg/parser.py": PARSER_FIXED},
    tests={"tests/test_parser.py": TESTS_NEW},
    problem_statement='''parse() crashes on values that contain "="

Reading a config with a database URL fails:

```
>>> from inicfg import parse
>>> parse("[db]\\nurl = postgres://h/db?sslmode=require\\n")
Traceback (most recent call last):
  ...
ValueError: too many values to unpack (expected 2)
```

Only the first `=` on a line separates the key from the value; the rest belongs to
the value.
''',
    fail_to_pass=("tests/test_parser.py::test_value_with_equals_sign",),
    pass_to_pass=(
        "tests/test_parser.py::test_sections_and_keys",
        "tests/test_parser.py::test_comments_and_blank_lines",
        "tests/test_parser.py::test_keys_before_section",
        "tests/test_parser.py::test_keys_are_lower_case",
        "tests/test_parser.py::test_bad_line",
        "tests/test_parser.py::test_get_bool",
    ),
)
