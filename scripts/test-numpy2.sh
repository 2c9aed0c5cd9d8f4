#!/usr/bin/env bash
# Readers' GPU instances run NumPy 2 and a current PyTorch, while the book's own
# environment pins NumPy 1.23.5 for MXNet. In a second, small environment
# (_build/venv-numpy2 from scripts/numpy2-venv.sh: the newest PyTorch CPU
# build on the package index, PaddlePaddle, NumPy 2) this runs the unit tests
# of the PyTorch and PaddlePaddle flavours (the multi-process scenarios marked slow ran in the
# pinned environment already), and then does with the PyTorch and PaddlePaddle
# notebook zips that scripts/test-notebooks.sh built what a reader does:
# unzip, install its d2l, run every notebook under nbval
# (scripts/check_notebook_zips.py).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=_build/venv-numpy2
book=${NUMPY2_NOTEBOOKS:-_build/test-book}
if [ ! -d "$book/_build/zips" ]; then
  echo "test-numpy2: $book/_build/zips is missing; run scripts/test-notebooks.sh first" >&2
  exit 1
fi
scripts/numpy2-venv.sh
$venv/bin/python -c 'import numpy, torch, paddle; print(f"== NumPy {numpy.__version__}, PyTorch {torch.__version__}, PaddlePaddle {paddle.__version__}")' 2>/dev/null
export PATH="$PWD/$venv/bin:$PATH" PYTHONPATH="$PWD" D2L_TEST_FRAMEWORKS=pytorch,paddle
# The modules whose claims are arithmetic on arrays, where NumPy 2 and a newer
# PyTorch could change a result; the process machinery and the argument
# checks do not depend on them, and every page's notebook runs below anyway.
tests=$(ls tests/test_helpers.py tests/test_d2l_package.py tests/test_multiple_gpus*.py \
  tests/test_sharded_data_parallel.py tests/test_pipeline_parallelism.py tests/test_tensor_parallelism.py \
  tests/test_transformer_tensor_parallelism.py tests/test_vit_mesh.py tests/test_context_parallelism.py \
  tests/test_expert_parallelism.py \
  tests/test_cost_model.py tests/test_memory.py tests/test_mixed_precision.py \
  tests/test_memory_model.py 2>/dev/null)
python -m pytest -q -p no:cacheprovider -n ${NUMPY2_WORKERS:-2} -m "not slow and not browser and not pdf" $tests
python scripts/check_notebook_zips.py "$book" --tabs pytorch paddle
