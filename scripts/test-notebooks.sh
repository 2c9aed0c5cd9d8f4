#!/usr/bin/env bash
# Evaluate the book in quick mode in a scratch copy (so the test run never
# mixes its outputs with those of `make book`): pages whose stored outputs are
# current are taken from outputs/, the others evaluated. Then do with the
# notebook zips what a new reader does: unzip one into an
# empty folder outside the repository, install the d2l it ships, and run every
# notebook there in quick mode under nbval, which fails on any cell that
# raises and on a deterministic cell whose output differs from the stored one
# (scripts/check_notebook_zips.py).
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=_build/test-book
# Copy the tracked and the new-but-not-ignored files; keep the scratch copy's
# own _build so unchanged notebooks are not evaluated twice in a row.
find "$scratch" -mindepth 1 -maxdepth 1 ! -name _build -exec rm -rf {} + 2>/dev/null || true
mkdir -p "$scratch"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$scratch"
export D2L_QUICK=1
scripts/eval-tabs.sh "$scratch"
rm -rf "$scratch/_build/zips"
python scripts/package_notebooks.py "$scratch" "$scratch/_build/zips"
# MXNet's zip here (MXNet 1.9 needs NumPy 1); the PyTorch and PaddlePaddle
# zips run in the readers' NumPy-2 environment (scripts/test-numpy2.sh), so no
# notebook is run twice after the build's own evaluation.
python scripts/check_notebook_zips.py "$scratch" --skip-evaluated --tabs ${ZIP_TABS:-mxnet}
