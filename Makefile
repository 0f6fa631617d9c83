.PHONY: install demo test lint docs

install:
	python -m pip install torch==2.13.0 -e ".[dev]"

demo:
	expert-cli train --manifest experts/demo/manifest.json --output runs/demo

test:
	python -m pytest -q

lint:
	python -m ruff check .

docs:
	python scripts/gen_manifest_docs.py
