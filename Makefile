.PHONY: demo test lint

demo:  ## run the main job end to end on embedded defaults
	bash scripts/demo.sh

test:  ## run ruff and the whole test suite
	bash scripts/test.sh

lint:
	.venv/bin/ruff check madr pipelines serve tests benchmarks
