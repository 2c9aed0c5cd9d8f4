#!/usr/bin/env bash
# Evaluate every tab of the book with d2lbook, in the book root given as $1
# (default: this checkout). Outputs: _build/eval (pytorch), _build/eval_mxnet,
# _build/eval_paddle.
#
# Stored outputs come first (scripts/stored_outputs.py): every page and tab
# whose stored full-mode outputs in outputs/ match its code, its d2l module
# and the framework versions is written from the store and not evaluated.
# d2lbook then evaluates only the rest (quick mode without a GPU), and each
# page gets its note on where its outputs come from. A page whose stored
# notebook (outputs/<tab>/<page>.ipynb, its record inside) is damaged is
# evaluated too, after a line naming the file and the fix. The script ends by
# listing which pages were reused and which evaluated.
set -euo pipefail
. "$(dirname "$0")/book-root.sh"
start=$SECONDS
"$PYTHON" "$scripts/stored_outputs.py" restore "$root"
tabs=$("$PYTHON" -c "import configparser; c = configparser.ConfigParser(); c.read('config.ini'); print(' '.join(t.strip() for t in c['build']['tabs'].split(',')))")
for tab in $tabs; do
  echo "== evaluating the $tab tab"
  "$PYTHON" "$scripts/d2lbook" build eval --tab "$tab"
done
"$PYTHON" "$scripts/stored_outputs.py" annotate "$root"
echo "eval-tabs: every tab of $root evaluated in $((SECONDS - start)) s"
