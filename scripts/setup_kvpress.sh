#!/usr/bin/env bash
# The kvpress environment (.venv-kvpress): kvpress pins transformers < 5.3 and pandas < 3, which
# TransformerLens 4 cannot share, so its side (integrations/kvpress_duo) runs here on the files
# tl_geometry exports. Idempotent: fast when everything is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TLG_KVPRESS_VENV:-$ROOT/.venv-kvpress}"
TAG=setup-kvpress
WANT="$(cat "$ROOT/scripts/setup_kvpress.sh" "$ROOT/scripts/venv_lib.sh" | sha256sum | cut -d' ' -f1)"
source "$ROOT/scripts/venv_lib.sh"
say "kvpress 0.5.5 (with its transformers and pandas), gguf (transformers reads the bundled models' files), pytest"
pip_q install "kvpress==0.5.5" "gguf>=0.10" "pytest>=7"
setup_done
