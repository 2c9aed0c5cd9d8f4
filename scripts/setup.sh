#!/usr/bin/env bash
# Create .venv with the pinned frameworks and install the Debian packages the
# build needs. Safe to run again: it does nothing when everything is in place.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# ccache: `import paddle` warns on every page when it finds no ccache on PATH.
DEB_PACKAGES="pandoc dataset-fashion-mnist ccache"
if [ "$(id -u)" = 0 ]; then
  # A one-machine Slurm for tests/test_cluster.py, which is skipped without it.
  DEB_PACKAGES="$DEB_PACKAGES slurm-wlm munge"
fi
if [ "${WITH_PDF:-0}" = 1 ]; then
  # TeX for `d2lbook build pdf`; poppler-utils for tests/test_pdf.py.
  DEB_PACKAGES="$DEB_PACKAGES texlive-xetex texlive-latex-extra latexmk librsvg2-bin fonts-freefont-otf texlive-fonts-recommended tex-gyre xindy poppler-utils"
fi
if [ "${WITH_BROWSER:-0}" = 1 ]; then
  # The browser tests (tests/test_rendered_book.py) drive Debian's Chromium
  # through Playwright (requirements.txt), which downloads no browser of its own.
  DEB_PACKAGES="$DEB_PACKAGES chromium"
fi

missing=""
for pkg in $DEB_PACKAGES; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian packages:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "setup: please install these Debian packages, then run make setup again:" >&2
    echo "    sudo apt-get install$missing" >&2
    exit 1
  fi
fi

# APT_ONLY=1: the Debian packages only (scripts/test.sh installs those of the
# browser and PDF checks in the background while the unit tests run).
if [ "${APT_ONLY:-0}" = 1 ]; then
  exit 0
fi

# The stamp records the requirements the venv was built from; a changed
# requirements.txt or pyproject.toml triggers a reinstall.
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: creating .venv (about two minutes on a fresh machine)"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q -r requirements.txt
.venv/bin/pip install -q --no-deps -e .
echo "$want" > "$stamp"
echo "setup: done"
