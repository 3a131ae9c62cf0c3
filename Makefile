# The two commands of README.md: `make book` and `make test`.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: book test env clean

# The environment: a venv with the pinned stack, rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e .
	$(VENV)/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
	touch $(STAMP)

env: $(STAMP)

# Execute every notebook at ci scale (cached), then build the HTML with warnings as errors.
book: $(STAMP)
	$(VENV)/bin/python -m lowrank.build

# Unit tests, golden verdicts and nbval on the executed notebooks (builds the book first).
test: book
	$(VENV)/bin/python -m pytest

clean:
	rm -rf _build
