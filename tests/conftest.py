"""Suite-wide: the skip policy (``tests/skip_policy.py``: which skips fail under BPO_REQUIRE_ALL=1)
and the pytest-xdist groups (``tests/xdist_groups.py``: tests that must not run beside each other)."""

from skip_policy import (  # noqa: F401 - pytest hooks
    pytest_collectreport,
    pytest_make_collect_report,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_terminal_summary,
)
from xdist_groups import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401 - pytest hooks
