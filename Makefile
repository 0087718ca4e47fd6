# The two commands of the README. Both set up .venv/ first (idempotent, seconds when done).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup analyze test lint bench legacy-test tl2-test kvpress-test bench-kvpress

setup:
	@bash scripts/setup.sh

analyze: setup
	$(VENV)/bin/tl-geometry analyze $(ARGS)

test: setup
	$(PY) -m ruff check tl_geometry tests benchmarks demos integrations scripts
	$(PY) -m pytest tests --doctest-modules tl_geometry $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check tl_geometry tests benchmarks demos integrations scripts

bench: setup
	$(PY) -m benchmarks.bench_analysis
	$(PY) -m benchmarks.bench_stream
	$(PY) -m benchmarks.bench_separability
	$(PY) -m benchmarks.bench_scaling
	$(PY) -m benchmarks.bench_distributed

# HookedTransformer path under TransformerLens 3.9.0, in a second venv with the same torch.
legacy-test:
	@TLG_VENV=.venv-tl3 TLG_EXTRA="transformer-lens==3.9.0" bash scripts/setup.sh
	.venv-tl3/bin/python -m pytest tests -m "not slow" $(PYTEST_ARGS)

# TransformerLens 2.x notebooks (HookedTransformer only, no bridge): TL 2.16.1 pins NumPy < 2, so
# datasets < 3 and pyarrow < 18 (newer ones need NumPy 2). The non-slow suite, then the real
# SmolLM2 as a HookedTransformer: it loads, matches the Hugging Face model, and the CLI runs.
TL2_REAL = smollm2_loads or matches_the_hugging_face or analyze_writes_results
tl2-test:
	@TLG_VENV=.venv-tl2 TLG_EXTRA="transformer-lens==2.16.1 datasets<3 pyarrow<18" bash scripts/setup.sh
	.venv-tl2/bin/python -m pytest tests -m "not slow" $(PYTEST_ARGS)
	.venv-tl2/bin/python -m pytest tests -m slow -k "$(TL2_REAL)" $(PYTEST_ARGS)


# kvpress reads the DuoAttention pattern tl_geometry exports, in a venv of its own (kvpress pins
# transformers < 5.3 and pandas < 3): the pattern of a real streaming curve is exported here, and
# kvpress must stream exactly its kv heads there.
kvpress-test: setup
	@bash scripts/setup_kvpress.sh
	$(PY) -m integrations.kvpress_duo.export_fixture .kvpress-fixture
	TLG_KVPRESS_FIXTURE=.kvpress-fixture .venv-kvpress/bin/python -m pytest -p no:cacheprovider --noconftest integrations/kvpress_duo $(PYTEST_ARGS)

# kvpress's presses against the plugin's DuoAttention pattern on the bundled SmolLM2 (about 12 min
# on 2 cores): docs/results/kvpress.md.
bench-kvpress: setup
	@bash scripts/setup_kvpress.sh
	$(PY) -m benchmarks.kvpress_inputs .kvpress-bench
	.venv-kvpress/bin/python -m benchmarks.bench_kvpress .kvpress-bench
