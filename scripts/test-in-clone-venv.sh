#!/usr/bin/env bash
# Run pytest (the arguments given) from a venv inside the clone, with torch's files inside it too: the most
# common layout (`python -m venv .venv` in the clone), where every file under the repository root is no
# longer the project's. Cheap: the venv sees the installed packages (--system-site-packages), the project
# goes in with `pip install --no-deps -e .`, and torch is linked into the venv's site-packages (not a second
# multi-GB install), so Python imports it, and reports its code, from under the clone. The venv is a
# fresh directory, removed at the end: a venv of yours is left alone.
#   scripts/test-in-clone-venv.sh tests/test_hot_path.py tests/test_long_lived.py
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d "$PWD/.venv-test-XXXXXX")"
trap 'rm -rf "$venv"' EXIT
python -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --no-deps -e .
torch_dir="$(python -c 'import pathlib, torch; print(pathlib.Path(torch.__file__).parent)')"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
ln -s "$torch_dir" "$site/torch"
"$venv/bin/python" -c "import sys, torch; assert torch.__file__.startswith(sys.argv[1]), torch.__file__" "$PWD/"
"$venv/bin/python" -m pytest -q "$@"
