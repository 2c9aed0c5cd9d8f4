#!/usr/bin/env bash
# Copy the parts of MathJax 3 that the HTML book uses from the npm package
# (package.json pins the version) into static/mathjax, which is committed so
# that building the book needs neither npm nor the network.
#
#   npm ci && scripts/vendor-mathjax.sh
#
# What is copied, relative to the package's es5/ folder:
#   tex-mml-chtml.js            the combined component Sphinx loads (mathjax_path)
#   output/chtml/fonts/woff-v2  the fonts the CHTML output asks for at run time
#   input/tex/extensions        TeX packages MathJax autoloads for macros such as \cancel
set -euo pipefail
cd "$(dirname "$0")/.."
src=node_modules/mathjax
dst=static/mathjax
if [ ! -f "$src/es5/tex-mml-chtml.js" ]; then
  echo "vendor-mathjax: $src is missing; run 'npm ci' first" >&2
  exit 1
fi
rm -rf "$dst"
mkdir -p "$dst/output/chtml/fonts" "$dst/input/tex"
cp "$src/es5/tex-mml-chtml.js" "$dst/"
cp -r "$src/es5/output/chtml/fonts/woff-v2" "$dst/output/chtml/fonts/"
cp -r "$src/es5/input/tex/extensions" "$dst/input/tex/"
cp "$src/LICENSE" "$dst/LICENSE"
version=$(node -p "require('./$src/package.json').version")
printf 'MathJax %s (Apache-2.0), copied from the npm package by scripts/vendor-mathjax.sh.\n' \
  "$version" > "$dst/VERSION.txt"
echo "vendor-mathjax: MathJax $version -> $dst ($(du -sh "$dst" | cut -f1))"
