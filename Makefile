# Set-up and the two entry points of the README.
#   make demo   create .venv, install skiplab and Fashion-MNIST, run the main job (skiplab demo)
#   make test   create .venv, install skiplab with test extras, run the test suite (a test skipped for a
#               package it could not import fails the run there: tests/conftest.py)
# A GPU user picks another PyTorch build, e.g.
#   make test TORCH="torch==2.11.0"   (torch >= 2.6; --fsdp >= 2.10: README.md)
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.skiplab-installed

FASHION_MNIST := /usr/share/datasets/fashion-mnist

.PHONY: demo test install data clean

demo: $(STAMP) data
	$(BIN)/skiplab demo

test: $(STAMP)
	SKIPLAB_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest -q

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_INDEX) "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m pip install -q --no-deps "torchscale==0.3.0" "fairscale==0.4.13" "ai2-olmo-core==3.0.0" \
		"dataclass-extensions==0.5.0" "mup==1.0.0" "liger-kernel==0.8.5"
	touch $(STAMP)

# The demo's data: Debian's dataset-fashion-mnist where apt is available and we are root; otherwise
# the demo downloads Fashion-MNIST when online, or says how to get it.
data:
	@if [ ! -f $(FASHION_MNIST)/train-images-idx3-ubyte.gz ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) || \
		echo "could not install dataset-fashion-mnist; the demo will try to download Fashion-MNIST"; \
	fi

clean:
	rm -rf $(VENV)
