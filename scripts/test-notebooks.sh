#!/usr/bin/env bash
# Evaluate every tab in quick mode in a scratch copy of the book (so the test
# run never mixes its outputs with those of `make book`), then re-run the
# produced notebooks under nbval, which fails on any cell that raises.
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
cd "$scratch"
notebooks=$(find _build/eval _build/eval_mxnet _build/eval_paddle \
  -path '*/chapter_*' -name '*.ipynb' -size +0 | sort)
echo "== nbval over $(echo "$notebooks" | wc -l) notebooks"
PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider --nbval-lax \
  --nbval-current-env --nbval-cell-timeout=1200 $notebooks
