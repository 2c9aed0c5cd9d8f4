#!/usr/bin/env bash
# make test: the stages (make test-unit, test-notebooks, then test-numpy2
# and test-rendered at once), while the NumPy-2 environment that
# test-numpy2 needs is built in the background, and so are the Debian
# packages of the browser and PDF checks (Chromium, TeX); prints each
# stage's time.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p _build
log=_build/numpy2-venv.log
scripts/numpy2-venv.sh > $log 2>&1 &
venv_pid=$!
apt_log=_build/apt.log
WITH_BROWSER=1 WITH_PDF=1 APT_ONLY=1 scripts/setup.sh > $apt_log 2>&1 &
apt_pid=$!
stop_background() {
  pkill -TERM -P $venv_pid 2>/dev/null || true  # pip, if still installing
  kill $venv_pid 2>/dev/null || true
  wait $apt_pid 2>/dev/null || true  # never leave dpkg half done
}
trap stop_background EXIT
times=""
stage() {
  local began=$SECONDS
  echo "== make $1"
  make --no-print-directory "$1"
  times+="  $1: $((SECONDS - began)) s"$'\n'
}
began=$SECONDS
stage test-unit
# Two notebooks run at once from here on, beside the renderer, so each
# process gets one OpenMP thread: a pool's threads spin while they wait for
# each other, and beside busy processes that spinning takes the cores (a
# sharded-data-parallel cell: under 1 s with one thread, 52 s with two,
# beside two busy processes).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
stage test-notebooks
if ! wait $venv_pid; then
  cat $log >&2
  echo "test: building the NumPy-2 environment failed (log above)" >&2
  exit 1
fi
cat $log
if ! wait $apt_pid; then
  cat $apt_log >&2
  echo "test: installing the Debian packages of the browser and PDF checks failed (log above)" >&2
  exit 1
fi
cat $apt_log
# NumPy 2 and the rendered book both read the scratch copy the notebook stage
# evaluated and write nothing the other reads. The rendered stage leaves
# about a third of the CPU idle (the browser and TeX mostly wait on one
# process), so the two run at once (322 s against 339 s one after the other).
# Each stage's output goes to its log, printed whole when it ends.
began_pair=$SECONDS
make --no-print-directory test-numpy2 > _build/test-numpy2.log 2>&1 &
numpy2_pid=$!
make --no-print-directory test-rendered > _build/test-rendered.log 2>&1 &
rendered_pid=$!
failed=""
for name in numpy2 rendered; do
  pid_var=${name}_pid
  if wait ${!pid_var}; then status=passed; else status=failed; failed+=" test-$name"; fi
  echo "== make test-$name ($status)"
  cat _build/test-$name.log
done
times+="  test-numpy2 and test-rendered at once: $((SECONDS - began_pair)) s"$'\n'
if [ -n "$failed" ]; then
  echo "test: failed:$failed (logs above)" >&2
  exit 1
fi
printf 'test: every stage passed in %d s\n%s' $((SECONDS - began)) "$times"
