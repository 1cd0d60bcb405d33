#!/usr/bin/env bash
# Build a peer's own environment in DIR and print its python, for the tests that run the peer itself:
#   scripts/make-peer-env.sh /tmp/venv-sae 'sae-lens>=6,<7'       # HOOK_RUNNER_SAE_PYTHON (-m sae)
#   scripts/make-peer-env.sh /tmp/venv-ct 'circuit-tracer==0.5.*'  # HOOK_RUNNER_CIRCUIT_TRACER_PYTHON (-m oracles)
#   scripts/make-peer-env.sh /tmp/venv-nnterp 'nnterp==1.3.*' 'nnsight>=0.6,<0.7'  # HOOK_RUNNER_NNTERP_PYTHON (-m oracles)
# sae-lens 6 and circuit-tracer 0.5 pin transformer-lens < 4 and nnterp 1.3 runs on nnsight 0.6, the project's
# oracles need transformer-lens 4 and nnsight 0.8: none can live in the project's env. The venv sees the running python's packages (--system-site-packages), so the installed
# torch is used (no second multi-GB torch), pinned to the project's 2.14.1 by a constraints file; what the
# peer needs in other versions (transformer-lens 3) is installed in DIR and shadows the outer one. Run it
# again on the same DIR: pip finds everything installed and it takes seconds.
set -euo pipefail
usage="usage: scripts/make-peer-env.sh DIR REQUIREMENT... (a new or existing directory for the venv, and what pip installs in it)"
dir="${1:?$usage}"
: "${2:?$usage}"
requirements=("${@:2}")
python="${PYTHON:-python}"
[ -x "$dir/bin/python" ] || "$python" -m venv --system-site-packages "$dir"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==2.14.1" >"$constraints"
"$dir/bin/python" -m pip install -q -c "$constraints" "${requirements[@]}"
"$dir/bin/python" -c "import torch; print('${requirements[*]} with torch', torch.__version__)" >&2
echo "$dir/bin/python"
