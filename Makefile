# distlab: the two commands a student needs are `make lab` and `make test`.
# Everything runs from a virtual environment in .venv, made on first use with $(PYTHON) -m venv.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Touched after a successful install; pip runs again only when pyproject.toml is newer than it.
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help env kernel lab test book student lint clean

help:
	@echo "make lab    set up .venv (first time only) and open JupyterLab on labs/"
	@echo "make test   run the whole suite: unit tests, every lab notebook (nbval), the book build"
	@echo "make book   draw the figures and build the book into _build/html"
	@echo "make student  write the student versions of the labs (solutions stubbed) into _build/student"
	@echo "make lint   ruff check src tests labs"
	@echo "make clean  remove build outputs (keeps .venv; 'rm -rf .venv' to start over)"

env: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { \
	  echo "distlab needs Python 3.10 or newer; '$(PYTHON)' is older. Run e.g. 'make PYTHON=python3.11 lab'."; \
	  exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	@touch $@

kernel: $(STAMP)
	$(BIN)/python -m ipykernel install --user --name distlab --display-name "Python (distlab)"

# LAB_ARGS passes options to JupyterLab (e.g. LAB_ARGS="--no-browser --port 8890"); as root (containers,
# cloud GPU nodes) JupyterLab refuses to start without --allow-root, so it is added there.
LAB_ARGS ?=
lab: kernel
	$(BIN)/jupyter lab labs/ $(LAB_ARGS) $(if $(filter 0,$(shell id -u)),--allow-root)

# One pytest run: tests/ (including tests/test_book.py, which builds the book) and every notebook in labs/.
# labs/nbval-sanitize.cfg blanks what varies between runs without being a result (progress bars).
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with labs/nbval-sanitize.cfg
test: $(STAMP)
	$(BIN)/pytest $(NBVAL) tests labs

book: $(STAMP)
	$(BIN)/python -m distlab.figures book/figures
	$(BIN)/jupyter-book build . -W -n --keep-going

# Instructors: the labs without their worked solutions (between "# BEGIN SOLUTION" and "# END SOLUTION").
student: $(STAMP)
	$(BIN)/python -m distlab.student labs/[0-9][0-9]_*.ipynb --out _build/student

lint: $(STAMP)
	$(BIN)/ruff check src tests labs

clean:
	rm -rf _build book/figures .pytest_cache .ruff_cache
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
