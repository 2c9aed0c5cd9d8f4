# Sourced by the build scripts: go to the book's root (the script's first
# argument, or this repository), put its d2l on the path, and choose Python.
scripts=$(cd "$(dirname "$0")" && pwd)
root=$(cd "${1:-$scripts/..}" && pwd)
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python}
