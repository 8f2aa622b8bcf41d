# The two commands of the README's Quickstart. Each sets up what it needs first (scripts/setup.sh:
# idempotent, seconds when nothing changed), so either works on a fresh clone, in either order.
#   make compare   the main job on the CPU default (bpo-compare; OUT=..., ARGS=... to change it)
#   make test      the tests on every core, at most 4 workers (pytest-xdist; tests/xdist_groups.py
#                  keeps what must not run side by side on one worker; docs/setup.md, "CI time");
#                  ARGS=... e.g. ARGS="-m slow"; XDIST= (empty) runs them in one process
VENV ?= .venv
OUT ?= results/compare
ARGS ?=
XDIST ?= -n auto --maxprocesses 4 --dist loadgroup

.PHONY: setup compare test

setup:
	VENV=$(VENV) bash scripts/setup.sh

compare: setup
	$(VENV)/bin/bpo-compare --out $(OUT) --resume $(ARGS)

test: setup
	$(VENV)/bin/pytest $(XDIST) $(ARGS)
