#!/usr/bin/env bash
# Build sae-lens 6's own environment in DIR and print its python, for the `sae` tests:
#   scripts/make-sae-env.sh DIR
#   HOOK_RUNNER_SAE_PYTHON=DIR/bin/python python -m pytest -q -m sae tests/test_sae.py
# sae-lens 6 pins transformer-lens < 4, the project's oracles need 4: it cannot live in the project's env.
# The venv sees the running python's packages (--system-site-packages), so the installed torch is used
# (no second multi-GB torch), pinned to the project's 2.14.1 by a constraints file; what sae-lens needs
# in other versions (transformer-lens 3) is installed in DIR and shadows the outer one. Run it again on
# the same DIR: pip finds everything installed and it takes seconds.
set -euo pipefail
dir="${1:?usage: scripts/make-sae-env.sh DIR (a new or existing directory for the venv of sae-lens)}"
python="${PYTHON:-python}"
[ -x "$dir/bin/python" ] || "$python" -m venv --system-site-packages "$dir"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==2.14.1" >"$constraints"
"$dir/bin/python" -m pip install -q -c "$constraints" 'sae-lens>=6,<7'
"$dir/bin/python" -c "import sae_lens, torch; print('sae-lens', sae_lens.__version__, 'torch', torch.__version__)" >&2
echo "$dir/bin/python"
