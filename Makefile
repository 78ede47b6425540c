# corral: `make demo` installs everything and runs a mission with the real Claude Code CLI (offline);
# `make test` installs everything and runs the checks and the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install system venv agents demo test lint typecheck unit integration bench clean

install: system venv agents

system:
	bash scripts/install-system.sh

$(STAMP): pyproject.toml
	bash scripts/install-venv.sh $(PYTHON) $(VENV)
	touch $(STAMP)

venv: $(STAMP)

# The pinned agent CLIs (Claude Code, Codex, Gemini CLI) from npm into tools/, never globally.
agents:
	bash scripts/install-agents.sh

# The main job: a mission run by the real Claude Code CLI, offline (synthetic provider).
demo: install
	$(BIN)/corral doctor
	$(BIN)/corral run examples/todo-api/MISSION.md --agent claude-code

lint: venv
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest tests/unit -q

integration: venv
	$(BIN)/pytest tests/integration -q

test: install lint typecheck
	$(BIN)/pytest -q

bench: install
	$(BIN)/python bench/exec_latency.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
