# Two commands: `make test` and `make book`. Each sets up .venv on first use.
PYTHON     ?= python3
VENV       ?= .venv
# The CPU wheel this machine keeps on disk. A GPU user overrides it, e.g.
#   make test TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"
TORCH_SPEC ?= torch==2.13.0
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.installed

.PHONY: test unit nbval book execute mathjax clean
MATHJAX    := .cache/node_modules/mathjax/es5/tex-chtml.js

# The editable install also builds the C kernel (setup.py) into lib/valuelab: redone when its source changes.
$(STAMP): requirements.txt pyproject.toml setup.py lib/valuelab/_gae_kernel.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

## make test: unit tests, every chapter under strict nbval, and the -W book build.
test: unit nbval book

unit: $(STAMP) mathjax
	$(BIN)/python -m pytest -q tests

## make mathjax: a local MathJax for the offline browser test (tests/test_browser.py), from npm.
mathjax: $(MATHJAX)
$(MATHJAX):
	@if command -v npm >/dev/null 2>&1; then \
	  mkdir -p .cache && npm install --prefix .cache --no-audit --no-fund --silent mathjax@3; \
	else echo "npm not found: tests/test_browser.py will be skipped"; fi

nbval: $(STAMP)
	$(BIN)/python -m pytest -q --nbval --nbval-current-env \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg chapters

## make book: build the HTML book into _build/html (zero warnings allowed).
book: $(STAMP)
	rm -rf _build/html _build/.doctrees
	$(BIN)/jupyter-book build . -W -n --keep-going

## make execute: re-run every chapter in a fresh kernel and store the outputs.
execute: $(STAMP)
	for nb in chapters/*.ipynb; do \
	  $(BIN)/jupyter nbconvert --to notebook --execute --inplace $$nb || exit 1; done

clean:
	rm -rf _build $(VENV) .cache
