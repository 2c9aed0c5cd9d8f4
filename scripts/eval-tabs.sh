#!/usr/bin/env bash
# Evaluate every tab of the book with d2lbook, in the book root given as $1
# (default: this checkout). Outputs: _build/eval (pytorch), _build/eval_mxnet,
# _build/eval_paddle. Only notebooks whose source changed are re-evaluated.
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
for tab in pytorch mxnet paddle; do
  echo "== evaluating the $tab tab"
  python "$root/scripts/d2lbook" build eval --tab "$tab"
done
