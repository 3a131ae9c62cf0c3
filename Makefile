# The two commands of README.md: `make book` and `make test`.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: book test unit reproduce diff laptop paper env clean browser lab

# The environment: a venv with the locked stack (pyproject.toml's ranges, requirements/lock.txt's exact
# versions), rebuilt when either changes. The lock pins torch's public version: add PyTorch's CPU index
# (PIP_EXTRA_INDEX_URL, as book.yml does) where no local `+cpu` wheel is at hand, or pip takes PyPI's CUDA build.
$(STAMP): pyproject.toml requirements/lock.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -c requirements/lock.txt -e '.[book,sweep,test,lab]'
	$(VENV)/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
	touch $(STAMP)

env: $(STAMP)

# Execute every notebook at ci scale (cached), then build the HTML with warnings as errors.
book: $(STAMP)
	$(VENV)/bin/python -m lowrank.book.build

# Unit tests, golden verdicts, figures, ledger and the browser check, all on the build's executed
# notebooks: in `make test` every notebook is executed exactly once (by `make book`).
# Two test processes, one file each at a time (pytest-xdist); one BLAS thread each (tests/conftest.py).
test: browser book
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile --durations=25

# The fast lane, no book: the unit tests that start no kernel, sweep or build (CONTRIBUTING.md).
unit: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 -q -m "not slow and not book"

# tests/test_html.py reads the book in Debian's Chromium (driven by playwright, no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "make test needs Chromium for the browser check of the book (tests/test_html.py)."; \
	  echo "Install it with:  sudo apt-get install -y chromium   (Debian/Ubuntu; .ci/run does this)"; \
	  exit 1; }

# nbval: a fresh kernel re-runs each executed notebook and must print the same verdict summary (cells
# tagged nbval-check-output: each verdict's outcome and whether it meets its golden entry), two
# notebooks at a time (pytest-xdist, one worker per notebook file). It executes every notebook a second
# time, so it is a reader's reproduction check, not part of `make test` (a unit test checks bit-identical
# reruns). `make reproduce CPU_PATH=default` runs the kernels on torch's portable CPU code path (other
# rounding): CI does, so that no verdict's agreement with its record depends on the machine.
CPU_PATH ?=
reproduce: book
	$(if $(CPU_PATH),ATEN_CPU_CAPABILITY=$(CPU_PATH)) OMP_NUM_THREADS=1 LOWRANK_STABILITY_FROM=$(CURDIR)/tests/golden_verdicts.yaml LOWRANK_FIGURE_DIR=$(CURDIR)/_build/nbval-figures \
		$(VENV)/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadfile \
		--nbval-lax --nbval-current-env -o testpaths= $$($(VENV)/bin/python -m lowrank.book.build --list-executed)

# The verdicts of the built notebooks that differ from tests/golden_verdicts.yaml (also within tolerance).
diff: book
	$(VENV)/bin/lowrank diff -o _build/verdict-diff.md

# Every notebook with a laptop file (params/laptop/) whose stored result in results/laptop/ is missing or
# stale (its parameters, its notebook or a module it imports changed), on this machine's CPUs, one at a
# time: minutes per page, sized from each mechanism (lowrank.book.laptop). A current result is not rerun.
laptop: $(STAMP)
	$(VENV)/bin/python -m lowrank.book.build --scale laptop

# Every notebook at paper scale (params/paper/) on the best device present (a GPU when there is one:
# hours; some notebooks need `lowrank data fetch mnist|cifar10` first, else they are skipped with a
# message), results with provenance into results/paper/, the paper-scale book into _build/paper/_build/html.
paper: $(STAMP)
	$(VENV)/bin/python -m lowrank.book.build --scale paper

# The notebooks in JupyterLab, opened as notebooks: the `lab` extra (JupyterLab, jupytext's viewer for
# the MyST .md files; in the venv) and binder/'s setting that makes that viewer the default, in the
# venv's own Jupyter configuration (jupyter_config_path's sys.prefix/etc/jupyter, not your home folder).
# Served from the clone's root, where jupytext finds jupytext.toml; it opens on notebooks/.
LAB_CONFIG := $(VENV)/etc/jupyter/labconfig
lab: $(STAMP)
	mkdir -p $(LAB_CONFIG)
	cp binder/labconfig/default_setting_overrides.json $(LAB_CONFIG)/
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/notebooks \
		$(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf _build
