# slurmkit: the two commands are `make demo` (the quickstart sweep) and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PYTEST_ARGS ?=

.PHONY: install demo lint test unit test-latest cluster-up cluster-down s3-up s3-down bench sbatch \
	readme-keys clean

# The venv, with slurmkit editable and pinned dev + CPU torch (torch==2.13.0, from constraints.txt).
# Editable in compat mode (a plain .pth path: no import hook run at every interpreter start), and
# byte-compiled like a pip-installed package (with PYTHONDONTWRITEBYTECODE, nothing else does it).
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP) install --quiet -c constraints.txt -e '.[dev,torch]' --config-settings editable_mode=compat
	touch $@

install: $(VENV)/.installed
	$(PY) -m compileall -q slurmkit

# The main job: the quickstart sweep (8 trials) on Slurm when reachable, else on this machine.
demo: install
	$(VENV)/bin/slurmkit sweep sweeps/quickstart.yaml --wait
	$(VENV)/bin/slurmkit results $$(ls -dt runs/quickstart-* | head -n 1) --sort loss

# Linters: ruff (lint + format), mypy on slurmkit/, shellcheck (Debian's) on the scripts under
# sbatch/ and the test set-up's (tests/s3, tests/cluster, tests/suite.sh, .ci/run).
lint: install
	@command -v shellcheck >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -q --no-install-recommends shellcheck; } >/tmp/slurmkit-apt.log 2>&1 || \
	  { echo "cannot install shellcheck: $$(tail -n 3 /tmp/slurmkit-apt.log)"; exit 1; }
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/mypy
	shellcheck -s bash sbatch/*.sbatch
	shellcheck -s sh slurmkit/runtime/selfcheck.sh
	shellcheck -x tests/s3/up.sh tests/s3/down.sh tests/suite.sh tests/cluster/up.sh tests/cluster/down.sh .ci/run

# Linters, then unit tests + integration tests on a real 4-node Slurm cluster and an S3 server
# (moto's, on 127.0.0.1: SLURMKIT_TEST_S3_URL, its request log SLURMKIT_TEST_S3_LOG), both started
# (and stopped) by tests/suite.sh: the cluster tests split between two clusters, one pytest process
# each, and the rest beside them.
test: lint
	SLURMKIT_FULL_SUITE=1 PY=$(abspath $(PY)) bash tests/suite.sh $(PYTEST_ARGS)

# The fast inner loop (under a minute): no cluster, nothing marked slow. pytest keeps its
# assertion-rewritten test modules in __pycache__ even where PYTHONDONTWRITEBYTECODE is set
# (this machine sets it): rewriting them all again costs each worker about 6 s.
unit: install
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n 2 -m "not cluster and not slow" $(PYTEST_ARGS)

# `make unit` against the newest releases of the libraries in LATEST (not part of `make test`):
# a venv of its own (.venv-latest), first as `make install` builds one but without the pins of
# LATEST, then LATEST upgraded to pip's newest whatever pyproject.toml's upper bounds say (pip
# names the bounds they cross; the upper bounds are what this target tests before they move).
# torch stays at constraints.txt's CPU build (a local file): PyPI's newest is a CUDA build of
# several GB.
LATEST := submitit fsspec s3fs click omegaconf PyYAML
LATEST_VENV := .venv-latest
test-latest:
	rm -rf $(LATEST_VENV)
	python3 -m venv $(LATEST_VENV)
	grep -viE '^($(subst $() ,|,$(LATEST)))==' constraints.txt > $(LATEST_VENV)/constraints.txt
	$(LATEST_VENV)/bin/pip install --quiet -c $(LATEST_VENV)/constraints.txt -e '.[dev,torch]' \
	  --config-settings editable_mode=compat
	$(LATEST_VENV)/bin/pip install --quiet --upgrade $(LATEST)
	$(LATEST_VENV)/bin/pip list 2>/dev/null | grep -iE '^($(subst $() ,|,$(LATEST))|torch) '
	$(LATEST_VENV)/bin/pip check || true
	touch $(LATEST_VENV)/.installed
	$(MAKE) unit VENV=$(LATEST_VENV)

cluster-up:
	bash tests/cluster/up.sh --accounting

cluster-down:
	bash tests/cluster/down.sh

# The tests' S3 server by hand (in /tmp/slurmkit-s3); then `. /tmp/slurmkit-s3/env.sh`.
s3-up: install
	SLURMKIT_TEST_S3_PYTHON=$(abspath $(PY)) bash tests/s3/up.sh

s3-down:
	bash tests/s3/down.sh

bench: install
	$(PY) bench/run.py
	$(PY) bench/checkpoint.py
	$(PY) bench/checkpoint.py --loop
	$(PY) bench/asha_decision.py

# Regenerate README.md's spec key reference from the table (slurmkit/spec/keys.py).
readme-keys: install
	$(PY) -m slurmkit.spec.schema --readme README.md

# Regenerate the ready-to-submit scripts under sbatch/ from sweeps/*.yaml.
sbatch: install
	@for f in sweeps/*.yaml; do \
	  n=$$(basename $$f .yaml); \
	  SLURMKIT_CONFIG=/dev/null $(VENV)/bin/slurmkit render $$f --plain > sbatch/$$n.sbatch || exit 1; \
	  echo "sbatch/$$n.sbatch"; \
	done

clean:
	rm -rf $(VENV) $(LATEST_VENV) runs .pytest_cache
