# Set-up and the two entry points of the README.
#   make demo   create .venv, install skiplab, run the main job
#   make test   create .venv, install skiplab with test extras, run the test suite
# A GPU user picks another PyTorch build, e.g.
#   make test TORCH="torch==2.5.1" TORCH_INDEX="--index-url https://download.pytorch.org/whl/cu124"
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.skiplab-installed

.PHONY: demo test install clean

demo: $(STAMP)
	$(BIN)/skiplab demo gradient-flow

test: $(STAMP)
	$(BIN)/python -m pytest -q

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_INDEX) "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

clean:
	rm -rf $(VENV)
