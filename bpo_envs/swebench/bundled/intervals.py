"""``intervals``: closed numeric intervals. Bug: ``merge`` keeps touching intervals apart."""

from bpo_envs.swebench.bundled.spec import Commit, RepoSource

CORE_V1 = '''"""Operations on lists of closed intervals ``(start, end)`` with ``start <= end``."""


def _check(intervals):
    for start, end in intervals:
        if start > end:
            raise ValueError(f"interval ({start}, {end}) has start > end")


def total_length(intervals):
    """Sum of the lengths of the intervals (overlaps counted once)."""
    return sum(end - start for start, end in merge(intervals))


def merge(intervals):
    """Merge overlapping intervals; return them sorted by start."""
    _check(intervals)
    merged = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
'''

CORE_V2 = CORE_V1 + '''

def contains(intervals, point):
    """Whether ``point`` lies in one of the intervals (ends included)."""
    return any(start <= point <= end for start, end in intervals)
'''

CORE_FIXED = CORE_V2.replace("start < merged[-1][1]", "start <= merged[-1][1]").replace(
    "Merge overlapping intervals;", "Merge overlapping or touching intervals;"
)

TESTS_V1 = '''import pytest

from intervals import merge, total_length


def test_merge_empty():
    assert merge([]) == []


def test_merge_overlapping():
    assert merge([(1, 4), (2, 6), (8, 9)]) == [(1, 6), (8, 9)]


def test_merge_unsorted():
    assert merge([(8, 9), (1, 3), (2, 4)]) == [(1, 4), (8, 9)]


def test_merge_rejects_reversed():
    with pytest.raises(ValueError):
        merge([(3, 1)])


def test_total_length_counts_overlap_once():
    assert total_length([(0, 2), (1, 3)]) == 3
'''

TESTS_V2 = TESTS_V1 + '''

def test_contains():
    from intervals import contains

    assert contains([(1, 2), (5, 7)], 7)
    assert not contains([(1, 2), (5, 7)], 3)
'''

TESTS_NEW = TESTS_V2 + '''

def test_merge_touching():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_merge_chain_of_touching():
    assert merge([(5, 6), (0, 1), (1, 5)]) == [(0, 6)]
'''

INIT = '''"""intervals: closed numeric intervals."""

from intervals.core import merge, total_length

__all__ = ["merge", "total_length"]
'''

INIT_V2 = '''"""intervals: closed numeric intervals."""

from intervals.core import contains, merge, total_length

__all__ = ["contains", "merge", "total_length"]
'''

REPO = RepoSource(
    name="intervals",
    version="1.1",
    commits=(
        Commit(
            "intervals: merge() and total_length()",
            {
                "README.md": "# intervals\n\nOperations on closed numeric intervals.\n",
                "setup.cfg": "[metadata]\nname = intervals\nversion = 1.0.0\n",
                ".gitignore": "__pycache__/\n*.pyc\n",
                "intervals/__init__.py": INIT,
                "intervals/core.py": CORE_V1,
                "tests/test_core.py": TESTS_V1,
            },
        ),
        Commit(
            "Add contains()",
            {
                "intervals/__init__.py": INIT_V2,
                "intervals/core.py": CORE_V2,
                "tests/test_core.py": TESTS_V2,
                "setup.cfg": "[metadata]\nname = intervals\nversion = 1.1.0\n",
            },
        ),
    ),
    fix={"intervals/core.py": CORE_FIXED},
    tests={"tests/test_core.py": TESTS_NEW},
    problem_statement='''merge() does not merge intervals that only touch

The intervals are closed, so `(1, 3)` and `(3, 5)` share the point 3 and should merge:

```python
>>> from intervals import merge
>>> merge([(1, 3), (3, 5)])
[(1, 3), (3, 5)]
```

Expected `[(1, 5)]`. `total_length` is not affected, but anything that relies on
`merge` returning disjoint intervals is.
''',
    fail_to_pass=(
        "tests/test_core.py::test_merge_touching",
        "tests/test_core.py::test_merge_chain_of_touching",
    ),
    pass_to_pass=(
        "tests/test_core.py::test_merge_empty",
        "tests/test_core.py::test_merge_overlapping",
        "tests/test_core.py::test_merge_unsorted",
        "tests/test_core.py::test_merge_rejects_reversed",
        "tests/test_core.py::test_total_length_counts_overlap_once",
        "tests/test_core.py::test_contains",
    ),
)
