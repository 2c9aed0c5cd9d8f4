#!/usr/bin/env bash
# The scratch copy that the notebook, NumPy-2 and rendered checks read
# (_build/test-book, so the test run never mixes its outputs with those of
# `make book`): the tracked and new-but-not-ignored files, every tab
# evaluated in quick mode (pages whose stored outputs are current are taken
# from outputs/, the others evaluated), and each framework's notebook zip.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=_build/test-book
# Keep the scratch copy's own _build so unchanged notebooks are not evaluated
# twice in a row.
find "$scratch" -mindepth 1 -maxdepth 1 ! -name _build -exec rm -rf {} + 2>/dev/null || true
mkdir -p "$scratch"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$scratch"
export D2L_QUICK=1
scripts/eval-tabs.sh "$scratch"
rm -rf "$scratch/_build/zips"
python scripts/package_notebooks.py "$scratch" "$scratch/_build/zips"
