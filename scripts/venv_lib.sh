# Sourced by setup.sh and setup_kvpress.sh: the venv $VENV with the CPU build of torch, remade only
# when $WANT (a hash of what it should hold) changed since the last set-up; `say` names each step
# (prefixed by $TAG) and `pip_q` installs quietly; `setup_done` records $WANT. Exits the caller
# (0) when there is nothing to do.
STAMP="$VENV/.tlg-setup-stamp"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  exit 0
fi
say() { echo "$TAG: $*"; }
say "installing into $VENV (a few minutes the first time; nothing to do on later runs)"
[[ -x "$VENV/bin/python" ]] || { say "creating the virtual environment"; "${PYTHON:-python3}" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# pip's machine-wide config names local wheel folders that may be absent; drop that noise only.
pip_q() { "${PIP[@]}" "$@" 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; }; }
# A plain `torch` requirement would pull a multi-GB CUDA build; take the local CPU wheel first.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  say "torch 2.13.0, the CPU build"
  pip_q install "torch==2.13.0"
fi
setup_done() { echo "$WANT" > "$STAMP"; say "done"; }
