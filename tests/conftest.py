"""Suite-wide: the skip policy (``tests/skip_policy.py``: which skips fail under BPO_REQUIRE_ALL=1)."""

from skip_policy import (  # noqa: F401 - pytest hooks
    pytest_make_collect_report,
    pytest_runtest_makereport,
    pytest_terminal_summary,
)
