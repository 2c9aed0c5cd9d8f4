#!/usr/bin/env bash
# The readers' environment for scripts/test-numpy2.sh: _build/venv-numpy2 with
# NumPy 2, the newest PyTorch CPU build on the package index, PaddlePaddle and
# the editable d2l. Does nothing when the venv matches its package list, so
# scripts/test.sh can build it in the background while the unit tests run.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=_build/venv-numpy2
# PyPI's newer torch wheels are CUDA builds that pull about 3 GB of NVIDIA
# libraries; 2.13.0 is the newest CPU build the index serves.
want="torch==2.13.0 paddlepaddle==3.3.1 numpy==2.4.6 matplotlib cloudpickle pytest pytest-timeout pytest-xdist hypothesis nbval nbclient nbformat ipykernel"
stamp=$venv/.stamp-editable
if [ -x $venv/bin/python ] && [ "$(cat $stamp 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "== creating $venv ($want)"
rm -rf $venv
python3 -m venv $venv
$venv/bin/pip install -q $want
# As `make setup` does for .venv: `from d2l import torch` from any folder.
$venv/bin/pip install -q --no-deps -e .
echo "$want" > $stamp
