# Build, test and read the book. `make help` lists the targets.
SHELL := /bin/bash
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# The notebooks import d2l from this checkout, whatever folder they run in.
export PYTHONPATH := $(CURDIR)
export PATH := $(BIN):$(PATH)
D2LBOOK := $(BIN)/python scripts/d2lbook
# Test processes at once (pytest-xdist). CI has two cores; a third process
# fills the time the failure scenarios spend waiting out their deadlines.
PYTEST_WORKERS ?= 3
export PYTEST_WORKERS

.PHONY: help setup lib eval html pdf book publish outputs-status store-gpu-run test test-unit test-notebooks test-numpy2 test-browser test-pdf test-rendered bench gpu-run clean

help:  ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

setup:  ## Create .venv and install the Debian packages (idempotent)
	@scripts/setup.sh

lib: setup  ## Regenerate d2l/{torch,mxnet,paddle}.py from the #@save cells
	$(D2LBOOK) build lib

eval: setup  ## Evaluate every tab of every section (quick mode without a GPU)
	scripts/eval-tabs.sh

html: eval  ## Render the HTML book with tab bars into _build/html (works offline)
	scripts/build-html.sh

pdf: eval  ## Render the book as PDF, one per framework, into _build/pdf*
	WITH_PDF=1 scripts/setup.sh
	scripts/build-pdf.sh

book: lib html  ## Set up, build the library, evaluate every tab and render the HTML
	@echo "The book is ready: open file://$(CURDIR)/_build/html/index.html"

# PAGES: page sources (default: every page); TABS: pytorch mxnet paddle (default: all).
publish: setup  ## Evaluate PAGES in TABS in full mode (D2L_QUICK=0) and store the outputs in outputs/
	$(BIN)/python scripts/stored_outputs.py publish $(if $(PAGES),--pages $(PAGES)) $(if $(TABS),--tabs $(TABS))

outputs-status: setup  ## Say for each page and tab whether its stored outputs match its code
	$(BIN)/python scripts/stored_outputs.py status

store-gpu-run: setup  ## Store the finished full-mode pages of _build/gpu-run in outputs/gpu/ (GPU_RUN_DIR)
	$(BIN)/python scripts/stored_outputs.py store-gpu $(if $(GPU_RUN_DIR),--run $(GPU_RUN_DIR))

test: setup  ## Unit tests; every notebook in quick mode under nbval; NumPy 2; the rendered HTML and PDF
	scripts/test.sh

test-unit: setup  ## The pytest suite under tests/ (except the browser and PDF checks)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=25 -m "not browser and not pdf" tests

test-browser: setup  ## Open every page of the built HTML in headless Chromium (BOOK_HTML_DIR)
	WITH_BROWSER=1 scripts/setup.sh
	$(BIN)/python -m pytest -q tests/test_rendered_book.py

test-pdf: setup  ## Check the built PDF: chapters, code, figures, equations, bibliography
	WITH_PDF=1 scripts/setup.sh
	$(BIN)/python -m pytest -q tests/test_pdf.py

test-notebooks: setup  ## Evaluate every tab in quick mode in a scratch copy, then nbval (lax)
	scripts/test-notebooks.sh

test-numpy2: setup  ## PyTorch and Paddle unit tests and notebooks again with NumPy 2 (after test-notebooks)
	scripts/test-numpy2.sh

test-rendered: setup  ## Render that scratch copy to HTML and PDF; browser and PDF tests
	scripts/test-rendered.sh

bench: setup  ## Benchmark the book's training code into _build/bench (BENCH_ARGS=--full on a GPU machine)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

GPU_PYTHON ?= python3
gpu-run:  ## On a GPU machine, with only PyTorch, NumPy and matplotlib: the PyTorch tab of every page in full mode into _build/gpu-run/pytorch/<page>.ipynb (GPU_RUN_ARGS)
	$(GPU_PYTHON) scripts/gpu_run.py $(GPU_RUN_ARGS)

clean:  ## Remove generated output (keeps .venv)
	rm -rf _build
