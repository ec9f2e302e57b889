# Two commands for people: `make lab` runs the course, `make test` checks it.
# Both create .venv when it is missing and reinstall when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=300 \
         --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: lab test lint unit nbval notebooks browser student stress clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,slides]"
	touch $@

# JupyterLab refuses to run as root without --allow-root (containers, CI); add it only there.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(LAB_ARGS) notebooks/

test: $(STAMP) browser
	$(PY) -m ruff check .
	$(PY) -m pytest tests notebooks $(NBVAL)

lint: $(STAMP)
	$(PY) -m ruff check .

unit: $(STAMP)
	$(PY) -m pytest tests

nbval: $(STAMP)
	$(PY) -m pytest notebooks $(NBVAL)

# Re-execute every notebook in place, top to bottom in a fresh kernel (commit the result).
notebooks: $(STAMP)
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=300 $(or $(NB),$(NOTEBOOKS))

# The real-browser test drives Debian's Chromium; install it where we can (root with apt).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
	      || echo "make browser: could not install chromium; the browser test will skip"; \
	  else echo "make browser: chromium missing and not root; the browser test will skip"; fi; }

# Regenerate the student exercise notebooks from the instructor masters and execute them.
student: $(STAMP)
	$(PY) -m dpcost.exercises.student

# Run every multi-process test K times and count the failures (not part of `make test`).
K ?= 20
stress: $(STAMP)
	$(PY) benchmarks/repeat.py --repeats $(K)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
