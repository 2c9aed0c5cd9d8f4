#!/usr/bin/env bash
# Prepare the scratch copy (scripts/prepare-test-book.sh; skipped when
# TEST_BOOK_PREPARED=1, as scripts/test.sh does while the unit tests run),
# then do with the notebook zips what a new reader does: unzip one into an
# empty folder outside the repository, install the d2l it ships, and run every
# notebook there in quick mode under nbval, which fails on any cell that
# raises and on a deterministic cell whose output differs from the stored one
# (scripts/check_notebook_zips.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${TEST_BOOK_PREPARED:-0}" != 1 ]; then
  scripts/prepare-test-book.sh
fi
# MXNet's zip here (MXNet 1.9 needs NumPy 1); the PyTorch and PaddlePaddle
# zips run in the readers' NumPy-2 environment (scripts/test-numpy2.sh), so no
# notebook is run twice after the build's own evaluation.
python scripts/check_notebook_zips.py _build/test-book --skip-evaluated --tabs ${ZIP_TABS:-mxnet}
