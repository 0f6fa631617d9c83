.PHONY: install demo test test-all lint format docs

install:
	python -m pip install torch==2.13.0 -e ".[dev]"

demo:
	expert-cli train --manifest experts/demo/manifest.json --output runs/demo

test:  # the fast loop: everything but the tests marked slow (the longest ones; CI runs all)
	python -m pytest -q -m "not slow"

test-all:  # what CI runs (.ci/run)
	python -m pytest -q

lint:
	python -m ruff check .
	python -m ruff format --check .

format:
	python -m ruff format .
	python -m ruff check --fix .

docs:
	python scripts/gen_manifest_docs.py
