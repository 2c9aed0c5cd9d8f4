# Build, test and read the book. `make help` lists the targets.
SHELL := /bin/bash
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# The notebooks import d2l from this checkout, whatever folder they run in.
export PYTHONPATH := $(CURDIR)
export PATH := $(BIN):$(PATH)
D2LBOOK := $(BIN)/python scripts/d2lbook
TABS := pytorch mxnet paddle

.PHONY: help setup lib eval html pdf book test test-unit test-notebooks clean

help:  ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

setup:  ## Create .venv and install the Debian packages (idempotent)
	@scripts/setup.sh

lib: setup  ## Regenerate d2l/{torch,mxnet,paddle}.py from the #@save cells
	$(D2LBOOK) build lib

eval: setup  ## Evaluate every tab of every section (quick mode without a GPU)
	scripts/eval-tabs.sh _build

html: eval  ## Render the HTML book with tab bars into _build/html
	rm -rf _build/eval_all _build/rst_all
	$(D2LBOOK) build html --tab all

pdf: eval  ## Render the book as PDF into _build/pdf
	WITH_PDF=1 scripts/setup.sh
	$(D2LBOOK) build pdf

book: lib html  ## Set up, build the library, evaluate every tab and render the HTML
	@echo "The book is ready: open file://$(CURDIR)/_build/html/index.html"

test: setup test-unit test-notebooks  ## Unit tests, then every notebook in quick mode with nbval

test-unit: setup  ## The pytest suite under tests/
	$(BIN)/python -m pytest -q tests

test-notebooks: setup  ## Evaluate every tab in quick mode in a scratch copy, then nbval (lax)
	scripts/test-notebooks.sh

clean:  ## Remove generated output (keeps .venv)
	rm -rf _build
