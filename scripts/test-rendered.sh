#!/usr/bin/env bash
# Render the scratch copy that scripts/test-notebooks.sh evaluated (no second
# evaluation), then check the result as a reader meets it: every HTML page in
# headless Chromium, and the PyTorch PDF's text.
set -euo pipefail
cd "$(dirname "$0")/.."
book=_build/test-book
if [ ! -f "$book/_build/eval/index.ipynb" ]; then
  echo "test-rendered: $book has not been evaluated; run scripts/test-notebooks.sh first" >&2
  exit 1
fi
WITH_BROWSER=1 WITH_PDF=1 scripts/setup.sh
scripts/build-html.sh "$book"
PDF_TABS=pytorch scripts/build-pdf.sh "$book"
name=$(python -c "import configparser; c = configparser.ConfigParser(); c.read('config.ini'); print(c['project']['name'])")
BOOK_HTML_DIR=$book/_build/html BOOK_PDF=$book/_build/pdf/$name.pdf \
  python -m pytest -q -p no:cacheprovider tests/test_rendered_book.py tests/test_pdf.py
