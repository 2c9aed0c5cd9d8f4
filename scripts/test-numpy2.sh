#!/usr/bin/env bash
# Readers' GPU instances run NumPy 2 and a current PyTorch, while the book's own
# environment pins NumPy 1.23.5 for MXNet. This builds a second, small
# environment (_build/venv-numpy2: the newest PyTorch CPU build on the package
# index, PaddlePaddle, NumPy 2) and runs there the PyTorch and PaddlePaddle
# unit tests and the quick-mode notebooks of those two tabs, as evaluated by
# scripts/test-notebooks.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=_build/venv-numpy2
# PyPI's newer torch wheels are CUDA builds that pull about 3 GB of NVIDIA
# libraries; 2.13.0 is the newest CPU build the index serves.
want="torch==2.13.0 paddlepaddle==3.3.1 numpy==2.4.6 matplotlib pytest pytest-timeout hypothesis nbclient nbformat ipykernel"
stamp=$venv/.stamp-editable
if [ ! -x $venv/bin/python ] || [ "$(cat $stamp 2>/dev/null)" != "$want" ]; then
  echo "== creating $venv ($want)"
  rm -rf $venv
  python3 -m venv $venv
  $venv/bin/pip install -q $want
  # As `make setup` does for .venv: `from d2l import torch` from any folder.
  $venv/bin/pip install -q --no-deps -e .
  echo "$want" > $stamp
fi
$venv/bin/python -c 'import numpy, torch, paddle; print(f"== NumPy {numpy.__version__}, PyTorch {torch.__version__}, PaddlePaddle {paddle.__version__}")' 2>/dev/null
export PATH="$PWD/$venv/bin:$PATH" PYTHONPATH="$PWD" D2L_TEST_FRAMEWORKS=pytorch,paddle
# The section modules; the others check the build (d2lbook, MXNet, the HTML).
tests=$(ls tests/test_helpers.py tests/test_d2l_package.py tests/test_bad_input.py tests/test_multiple_gpus*.py \
  tests/test_process_groups.py tests/test_distributed_data_parallel.py tests/test_sharded_data_parallel.py \
  tests/test_cost_model.py 2>/dev/null)
python -m pytest -q -p no:cacheprovider -m "not browser and not pdf" $tests
book=${NUMPY2_NOTEBOOKS:-_build/test-book}
python scripts/run_notebooks.py --root "$book" \
  $(find "$book/_build/eval" "$book/_build/eval_paddle" -path '*/chapter_*' -name '*.ipynb' -size +0 | sort)
