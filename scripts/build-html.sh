#!/usr/bin/env bash
# Render the HTML book with tab bars from freshly merged tab outputs, then make
# it work offline. Run it after every tab is evaluated (scripts/eval-tabs.sh).
#
#   scripts/build-html.sh [BOOK_ROOT]      (default: this checkout)
#
# Steps, all inside BOOK_ROOT:
#   1. remove _build/eval_all and _build/rst_all, so d2lbook merges the tabs
#      anew instead of keeping a stale merge (a known d2lbook trap);
#   2. d2lbook build html --tab all (warnings are errors: see config.ini; a
#      tab whose outputs are older than its source is evaluated again here);
#   3. zip each framework's notebooks into _build/html for download;
#   4. copy the PDFs in, if `make pdf` has built them;
#   5. scripts/offline_html.py: drop the analytics loader, serve the copy icon
#      locally, fix the header links, and fail on any load from another host.
set -euo pipefail
. "$(dirname "$0")/book-root.sh"

name=$("$PYTHON" -c "import configparser; c = configparser.ConfigParser(); c.read('config.ini'); print(c['project']['name'])")
tabs=$("$PYTHON" -c "import configparser; c = configparser.ConfigParser(); c.read('config.ini'); print(' '.join(t.strip() for t in c['build']['tabs'].split(',')))")
first=${tabs%% *}
for tab in $tabs; do
  dir=_build/eval; [ "$tab" = "$first" ] || dir=_build/eval_$tab
  if [ ! -f "$dir/index.ipynb" ]; then
    echo "build-html: $root/$dir is missing; evaluate every tab first: scripts/eval-tabs.sh $root" >&2
    exit 1
  fi
done

start=$SECONDS
rm -rf _build/eval_all _build/rst_all
"$PYTHON" "$scripts/d2lbook" build html --tab all
"$PYTHON" "$scripts/package_notebooks.py" "$root" _build/html
for pdf in "_build/pdf/$name.pdf" _build/pdf_*/"$name"-*.pdf; do
  if [ -f "$pdf" ]; then cp "$pdf" _build/html/; fi
done
"$PYTHON" "$scripts/offline_html.py" _build/html
echo "build-html: $root/_build/html/index.html ready in $((SECONDS - start)) s"
