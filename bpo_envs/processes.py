"""Helpers for this package's worker processes."""

from __future__ import annotations

import os
import threading
import time


def exit_with_parent(parent: int | None = None, poll_s: float = 1.0) -> None:
    """End this process (``os._exit(1)``) as soon as its parent, ``parent`` (its process id as
    the parent knew it; default: the current parent), is gone.

    A worker busy in a long call (a planner search, a training run) would otherwise outlive a
    parent killed with SIGKILL or SIGTERM, go on using the CPU, and keep writing into folders a
    resumed run then uses too. A daemon thread polls ``os.getppid()``: when the parent dies, the
    worker is handed to another process and its parent id changes. Pass ``parent`` when the
    call comes late in the worker's start (after heavy imports): the parent may be gone already.
    """
    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
