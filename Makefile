# Trainyard: `make run` serves API + worker on SQLite; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install run test lint typecheck pytest bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Trainyard needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP)

run: install
	$(BIN)/trainyard migrate
	$(BIN)/trainyard up

lint: install
	$(BIN)/ruff check service workers trainyard tests migrations benchmarks recipes examples
	$(BIN)/ruff format --check service workers trainyard tests migrations benchmarks recipes examples

typecheck: install
	$(BIN)/mypy

# Two processes, each taking whole files: the end-to-end tests spend most of their time
# starting servers and waiting on training, so two of them share the cores well (12 min
# serially, 8 in two, on 2 cores); TEST_PROCS=0 runs serially.
TEST_PROCS ?= 2
pytest: install
	$(BIN)/pytest -n $(TEST_PROCS) --dist loadfile --durations=20

test: lint typecheck pytest

bench: install
	$(BIN)/python -m benchmarks

# Builds the image and runs docker-compose.yml from it, for real (root: its own dockerd;
# several minutes, so not in `make test`); skipped, saying why, where it cannot run.
image-check: install
	bash scripts/image_check.sh

# A new GPU box's check (README, "Checking a GPU box"): the gpu-marked tests and the
# one-GPU overhead benchmark in one table (~5 min, estimated); exits 0 saying so without a GPU.
.PHONY: gpu-check
gpu-check: install
	$(BIN)/python -m benchmarks.gpu_check

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
