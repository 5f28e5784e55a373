# distlab: the two commands a student needs are `make lab` and `make test`.
# Everything runs from a virtual environment in .venv, made on first use with $(PYTHON) -m venv.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Touched after a successful install; pip runs again only when pyproject.toml is newer than it.
STAMP  := $(VENV)/.installed
# TORCH_INDEX: a package index to take torch from before installing the rest. On Linux, PyPI's torch is the
# CUDA build (several GB with its CUDA libraries); a laptop without an NVIDIA GPU can take PyTorch's
# CPU-only build instead: `make lab TORCH_INDEX=$(CPU_TORCH_INDEX)`. The version is pyproject.toml's pin.
TORCH_INDEX ?=
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
TORCH_PIN := $(shell grep -o 'torch==[0-9][0-9a-z.]*' pyproject.toml | head -n 1)
TORCH_VERSION := $(patsubst torch==%,%,$(TORCH_PIN))
# Whether this .venv lacks torch at the pinned version (a local label such as +cpu or +cu130 is fine).
NEEDS_TORCH = ! $(BIN)/python -c 'import importlib.metadata as m, sys; \
	  sys.exit(m.version("torch").split("+")[0] != "$(TORCH_VERSION)")' >/dev/null 2>&1
# Said before the torch download starts, on Linux without an NVIDIA GPU (no nvidia-smi, no
# /proc/driver/nvidia) and no TORCH_INDEX given: what happens next, and how to take the CPU build instead. It
# only prints (CI and scripts never wait on it); the download then shows its own progress.
NO_GPU_NOTICE = if [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1 \
	  && [ ! -e /proc/driver/nvidia ] && $(NEEDS_TORCH); then \
	  echo "distlab: this Linux machine has no NVIDIA GPU. Next, pip downloads $(TORCH_PIN) from its default"; \
	  echo "distlab: index (PyPI unless your pip is configured otherwise), which on PyPI is the CUDA build:"; \
	  echo "distlab: several GB with its CUDA libraries, minutes on a fast line. For the CPU-only build"; \
	  echo "distlab: (a few hundred MB), stop it with Ctrl-C at any time and run:"; \
	  echo "distlab:     make $(or $(MAKECMDGOALS),lab) TORCH_INDEX=$(CPU_TORCH_INDEX)"; fi
INSTRUCTOR_HTML := _build/instructor/_build/html

.DEFAULT_GOAL := help
# The student's own copies of the labs (no worked solutions): made once by `make lab`, never overwritten.
MYLABS ?= mylabs
.PHONY: help env kernel lab mylabs lab-reset lab-instructor progress test book book-instructor student lint clean \
	gpu-check grade check

help:
	@echo "make lab    set up .venv (first time only) and open JupyterLab on your own copies of the labs,"
	@echo "            in $(MYLABS)/ (made once, without the worked solutions; your work there is never overwritten)"
	@echo "make lab-reset LAB=04  start lab 04 afresh (your copy is kept as $(MYLABS)/04_*.before-reset.ipynb;"
	@echo "            every later reset keeps one more: .before-reset-2.ipynb, -3, ...)"
	@echo "make progress  which exercises pass, fail or are not written yet (also: .venv/bin/distlab progress)"
	@echo "make test   run the whole suite: unit tests, every lab notebook (nbval), the book build"
	@echo "make book   draw the figures and build the public book (no worked solutions) into _build/html"
	@echo "make book-instructor  the same book with the worked solutions, into $(INSTRUCTOR_HTML)"
	@echo "make student  write the student versions of the labs (solutions stubbed) into _build/student"
	@echo "make grade  grade a class: one folder of notebooks per student in $(SUBMISSIONS)/ (SUBMISSIONS=...),"
	@echo "            public and hidden cases; report in $(GRADES)/grades.{csv,json,html}"
	@echo "make check  run the public cases of every lab in $(MYLABS)/, as the grader will (before handing in)"
	@echo "On a Linux laptop without a GPU: make lab TORCH_INDEX=$(CPU_TORCH_INDEX)  (CPU-only torch)"
	@echo "make lab-instructor  open JupyterLab on labs/: the full labs, with the worked solutions"
	@echo "make lint   ruff check src tests labs tools"
	@echo "make clean  remove build outputs (keeps .venv; 'rm -rf .venv' to start over)"
	@echo "make gpu-check  on a GPU node: every chapter on CUDA/NCCL, memory and bandwidths; report in assets/gpu/"

env: $(STAMP)

# Chapter 11 compares itself with torchft, whose wheels are Linux-only (elsewhere its tests and lab cells skip).
PACKAGE := $(if $(filter Linux,$(shell uname -s)),.[torchft],.)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { \
	  echo "distlab needs Python 3.10 or newer; '$(PYTHON)' is older. Run e.g. 'make PYTHON=python3.11 lab'."; \
	  exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(if $(TORCH_INDEX),:,$(NO_GPU_NOTICE))
	@if $(NEEDS_TORCH); then echo "distlab: installing $(TORCH_PIN) first, the largest download (pip shows it):"; \
	  $(BIN)/python -m pip install --disable-pip-version-check "$(TORCH_PIN)" \
	  $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); fi
	@echo "distlab: installing distlab and the rest of its dependencies (quietly; a minute or two)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '$(PACKAGE)'
	@touch $@

# The kernel goes inside .venv (--sys-prefix), where the JupyterLab of this .venv finds it; nothing outside
# the clone changes, so two clones never point each other's notebooks at the wrong .venv.
kernel: $(STAMP)
	$(BIN)/python -m ipykernel install --sys-prefix --name distlab --display-name "Python (distlab)"

# LAB_ARGS passes options to JupyterLab (e.g. LAB_ARGS="--no-browser --port 8890"); as root (containers,
# cloud GPU nodes) JupyterLab refuses to start without --allow-root, so it is added there.
LAB_ARGS ?=
# `make lab` opens the student's copies in $(MYLABS)/ (git ignores it); `make mylabs` writes the ones that are
# missing there and never touches one that exists. Progress goes to ~/.distlab/progress.json (distlab.progress).
ALLOW_ROOT = $(if $(filter 0,$(shell id -u)),--allow-root)
# JupyterLab serves the whole clone (root_dir) and opens the labs' folder (default_url), so a lab's links to
# its chapter and to the notation page (../book/*.md) open inside JupyterLab; a root of mylabs/ or labs/
# would put the book outside what the server can reach (tests/test_student.py resolves every link).
SERVE = $(BIN)/jupyter lab --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/$(1) \
	$(LAB_ARGS) $(ALLOW_ROOT)
# $(MYLABS) as a path inside the clone, or an error saying so (JupyterLab could not reach it).
MYLABS_IN_CLONE = $(patsubst $(CURDIR)/%,%,$(abspath $(MYLABS)))
lab: kernel mylabs
	@case "$(abspath $(MYLABS))" in "$(CURDIR)"/*) ;; *) echo "MYLABS=$(MYLABS) is outside this clone;" \
	  "JupyterLab serves the clone, so choose a folder inside it (default: mylabs)"; exit 2;; esac
	$(call SERVE,$(MYLABS_IN_CLONE))

mylabs: $(STAMP)
	@$(BIN)/python -m distlab.student labs/[0-9][0-9]_*.ipynb --out $(MYLABS) --keep

lab-reset: $(STAMP)
	@test -n "$(LAB)" || { echo "Say which lab to start afresh, e.g. make lab-reset LAB=04"; exit 2; }
	@set -- labs/$(LAB)_*.ipynb; test -f "$$1" || { echo "No lab numbered '$(LAB)' in labs/ (e.g. LAB=04)"; \
	  exit 2; }; $(BIN)/python -m distlab.student "$$1" --out $(MYLABS) --reset

# Instructors: the full labs, with the worked solutions and their stored outputs. Nothing is recorded as the
# student's progress: a lab that holds its solutions records for its own kernel only (distlab.progress).
lab-instructor: kernel
	$(call SERVE,labs)

progress: $(STAMP)
	@$(BIN)/distlab progress

# Two pytest runs: tests/ (including tests/test_book.py, which builds the book), then every notebook in labs/
# under nbval. The labs run with one thread (OMP_NUM_THREADS=1) while their stored outputs were made with
# the machine's default, several threads: an output that depends on the thread count fails here, not on a
# student's machine (tests/test_reproducible.py). labs/nbval-sanitize.cfg blanks what varies between runs
# without being a result (progress bars).
# Both runs use TEST_WORKERS processes (pytest-xdist): for tests/, --dist loadgroup keeps the tests that share
# the book builds in one of them (tests/conftest.py); for labs/, --dist loadfile keeps each notebook's cells
# in one kernel, in order. TEST_WORKERS=1 runs them in one process, as plain pytest does.
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with labs/nbval-sanitize.cfg
TEST_WORKERS ?= 2
# The labs' checks record their verdicts in a temporary file here (DISTLAB_PROGRESS), never in a student's
# ~/.distlab/progress.json; tests/conftest.py does the same for tests/.
test: $(STAMP)
	$(BIN)/pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup) --durations=25 tests
	tmp=$$(mktemp -d) && DISTLAB_PROGRESS=$$tmp/progress.json OMP_NUM_THREADS=1 \
	  $(BIN)/pytest $(NBVAL) $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) \
	  --durations=15 labs; status=$$?; rm -rf "$$tmp"; exit $$status

# Two editions of the book (tools/distlab_book.py): the public site, whose labs show each check's verdict
# but not the worked solution, and the instructor's, with the solutions. Both build offline.
book: $(STAMP)
	$(BIN)/python -m distlab.figures book/figures
	DISTLAB_BOOK_EDITION=public $(BIN)/jupyter-book build . -W -n --keep-going

book-instructor: $(STAMP)
	$(BIN)/python -m distlab.figures book/figures
	DISTLAB_BOOK_EDITION=instructor $(BIN)/jupyter-book build . --path-output _build/instructor -W -n --keep-going
	@echo "The instructor edition is in $(INSTRUCTOR_HTML)/index.html"

# Instructors: the labs without their worked solutions (between "# BEGIN SOLUTION" and "# END SOLUTION"),
# and without what a run leaves behind (outputs, execution metadata, widget state), as nbstripout does.
student: $(STAMP)
	$(BIN)/python -m distlab.student labs/[0-9][0-9]_*.ipynb --out _build/student

# Instructors: grade a class (distlab.grading). SUBMISSIONS holds one folder per student with their notebooks;
# each student's lab runs in a fresh, time-bounded process that may write only inside its temporary folder.
SUBMISSIONS ?= submissions
GRADES ?= _build/grades
GRADE_TIMEOUT ?= 120
grade: $(STAMP)
	$(BIN)/distlab grade $(SUBMISSIONS) --out $(GRADES) --timeout $(GRADE_TIMEOUT)

check: $(STAMP)
	$(BIN)/distlab check $(MYLABS)

lint: $(STAMP)
	$(BIN)/ruff check src tests labs tools

clean:
	rm -rf _build book/figures .pytest_cache .ruff_cache
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

# On a GPU node: `pytest -m gpu` (every chapter on NCCL at world size 1 and one rank per GPU, several ranks
# sharing cuda:0 on gloo, chapter 7's measured peak); every lab under nbval in two modes, "gpus" (NCCL with a
# GPU per rank where the node has enough, else gloo on the CPU) and "shared" (CUDA_VISIBLE_DEVICES=0 and
# DISTLAB_DEVICE=cuda: every rank's tensors on cuda:0, gloo between them); then the measurements; one report
# (JSON + text) in assets/gpu/. A one-GPU report proves the device code, not NCCL between GPUs
# (book/gpu-node.md). Exits non-zero on any failure; without CUDA it says it found no GPU and exits 0
# (src/distlab/gpu_check/).
gpu-check: $(STAMP)
	$(BIN)/python -m distlab.gpu_check
