#!/usr/bin/env bash
# Render the book as PDF with d2lbook (XeLaTeX), one PDF per framework tab.
# Run it after every tab is evaluated (scripts/eval-tabs.sh).
#
#   scripts/build-pdf.sh [BOOK_ROOT]       (default: this checkout)
#
# Writes _build/pdf/<name>.pdf (the first tab, PyTorch) and
# _build/pdf_<tab>/<name>-<tab>.pdf for the other tabs; PDF_TABS="pytorch"
# limits the build to the listed tabs. If the HTML book exists, the PDFs are
# copied next to it and its PDF link is switched on.
set -euo pipefail
. "$(dirname "$0")/book-root.sh"
if ! command -v xelatex >/dev/null || ! command -v latexmk >/dev/null; then
  echo "build-pdf: XeLaTeX and latexmk are missing; run: WITH_PDF=1 scripts/setup.sh" >&2
  exit 1
fi
read -r name tabs < <("$PYTHON" -c "
import configparser
c = configparser.ConfigParser(); c.read('config.ini')
print(c['project']['name'], ' '.join(t.strip() for t in c['build']['tabs'].split(',')))")
first=${tabs%% *}
for tab in ${PDF_TABS:-$tabs}; do
  eval_dir=_build/eval; pdf=_build/pdf/$name.pdf; tab_arg=()
  if [ "$tab" != "$first" ]; then
    eval_dir=_build/eval_$tab; pdf=_build/pdf_$tab/$name-$tab.pdf; tab_arg=(--tab "$tab")
  fi
  if [ ! -f "$eval_dir/index.ipynb" ]; then
    echo "build-pdf: $root/$eval_dir is missing; evaluate every tab first: scripts/eval-tabs.sh $root" >&2
    exit 1
  fi
  start=$SECONDS
  rm -f "$pdf"
  # latexmk's output goes to a log: it is long, and d2lbook stops on a failure anyway.
  log=_build/pdf-$tab.log
  if ! "$PYTHON" "$scripts/d2lbook" build pdf "${tab_arg[@]}" > "$log" 2>&1 || [ ! -f "$pdf" ]; then
    tail -40 "$log" >&2
    echo "build-pdf: the $tab PDF failed; the full log is $root/$log" >&2
    exit 1
  fi
  pages=$(pdfinfo "$pdf" 2>/dev/null | awk '/^Pages:/ {print $2}')
  echo "build-pdf: $pdf (${pages:-?} pages) in $((SECONDS - start)) s"
  if [ -f _build/html/index.html ]; then
    cp "$pdf" _build/html/
  fi
done
if [ -f _build/html/index.html ]; then
  "$PYTHON" "$scripts/offline_html.py" _build/html
fi
