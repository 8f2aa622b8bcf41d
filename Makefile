# The two commands of the README's Quickstart. Each sets up what it needs first (scripts/setup.sh:
# idempotent, seconds when nothing changed), so either works on a fresh clone, in either order.
#   make compare   the main job on the CPU default (bpo-compare; OUT=..., ARGS=... to change it)
#   make test      the tests (pytest in one process; ARGS=... e.g. ARGS="-m slow"). On every core:
#                  XDIST="-n auto --maxprocesses 4 --dist loadgroup" (tests/xdist_groups.py; not the
#                  default yet: docs/setup.md, "CI time")
VENV ?= .venv
OUT ?= results/compare
ARGS ?=
XDIST ?=

.PHONY: setup compare test

setup:
	VENV=$(VENV) bash scripts/setup.sh

compare: setup
	$(VENV)/bin/bpo-compare --out $(OUT) --resume $(ARGS)

test: setup
	$(VENV)/bin/pytest $(XDIST) $(ARGS)
