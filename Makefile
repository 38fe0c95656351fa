# Developer entry points. `make up` runs the whole stack on the embedded dev checkpoint;
# `make test` runs the test suite. Both create .venv on first use with the CPU build of torch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU torch pinned for dev and CI: an unpinned `torch` can pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install up test test-fast compose-test lint format protos protos-check bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(BIN)/.installed

up: install
	$(BIN)/qwen3-tts up $(ARGS)

test: install lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# deploy/ on a real container engine: the image built, `docker compose up` (CPU override) served
# and checked, a killed container restarted by compose (tests/integration/compose_engine_check.py;
# scripts/container_engine.sh finds or sets up the engine). Skips, saying why, where no engine can
# be had. Not part of `make test`; .ci/run runs both.
compose-test: install
	$(BIN)/python -m pytest -q -s tests/integration/compose_engine_check.py $(PYTEST_ARGS)

# Lint and format check (ruff, configured in pyproject.toml); `make format` rewrites the files.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test-fast: install
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

protos: install
	$(BIN)/python scripts/gen_protos.py

protos-check: install
	$(BIN)/python scripts/gen_protos.py --check

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
