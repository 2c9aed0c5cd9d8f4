#!/usr/bin/env bash
# make test: the unit tests (make test-unit) while, in the background, the
# scratch copy of the book is prepared (scripts/prepare-test-book.sh), the
# NumPy-2 environment that test-numpy2 needs is built, and the Debian packages
# of the browser and PDF checks (Chromium, TeX) are installed; then the checks
# that read the scratch copy, at once: the MXNet notebook zip followed by the
# NumPy-2 checks (make test-notebooks, then test-numpy2), beside the rendered
# book (make test-rendered). Prints each stage's time.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p _build
log=_build/numpy2-venv.log
scripts/numpy2-venv.sh > $log 2>&1 &
venv_pid=$!
apt_log=_build/apt.log
WITH_BROWSER=1 WITH_PDF=1 APT_ONLY=1 scripts/setup.sh > $apt_log 2>&1 &
apt_pid=$!
kill_tree() {  # kill_tree PID: the process and everything it started
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null || true
}
stop_background() {  # the jobs still running: each is unset once waited for
  local pid
  for pid in ${venv_pid:-} ${prepare_pid:-} ${zips_pid:-} ${rendered_pid:-}; do
    kill_tree "$pid"
  done
  wait $apt_pid 2>/dev/null || true  # never leave dpkg half done
}
trap stop_background EXIT
trap 'exit 130' INT  # so that the EXIT trap runs
trap 'exit 143' TERM
times=""
stage() {
  local began=$SECONDS
  echo "== make $1"
  make --no-print-directory "$1"
  times+="  $1: $((SECONDS - began)) s"$'\n'
}
began=$SECONDS
# From here on each process gets one OpenMP thread: a pool's threads spin
# while they wait for each other, and beside busy processes that spinning
# takes the cores (a sharded-data-parallel cell: under 1 s with one thread,
# 52 s with two, beside two busy processes). Preparing the scratch copy
# takes one core for about a minute beside the unit tests (where the stored
# outputs of a page are stale, the page is evaluated there).
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} scripts/prepare-test-book.sh \
  > _build/test-book-prepare.log 2>&1 &
prepare_pid=$!
stage test-unit
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
waited() {  # waited PID LOG WHAT: wait for a background job, print its log
  if ! wait "$1"; then
    cat "$2" >&2
    echo "test: $3 failed (log above)" >&2
    exit 1
  fi
  cat "$2"
}
waited $prepare_pid _build/test-book-prepare.log "preparing the scratch copy of the book"
prepare_pid=
waited $venv_pid $log "building the NumPy-2 environment"
venv_pid=
waited $apt_pid $apt_log "installing the Debian packages of the browser and PDF checks"
# The notebook zips and the rendered book all read the scratch copy and write
# nothing another reads. Alone, the rendered stage leaves part of the CPU
# idle (the browser and TeX mostly wait on one process), and so do the seams
# between the zip checks; side by side they keep both cores busy. Beside the
# rendered book run MXNet's zip (NumPy 1), then the NumPy-2 checks. Each
# stage's output goes to its log, printed whole when all three have ended.
checked() {  # checked NAME: make test-NAME into its log; "status seconds"
  local began=$SECONDS status=passed
  make --no-print-directory "test-$1" > "_build/test-$1.log" 2>&1 || status=failed
  echo "$status $((SECONDS - began))" > "_build/test-$1.result"
}
rm -f _build/test-*.result
began_checks=$SECONDS
(export TEST_BOOK_PREPARED=1; checked notebooks; checked numpy2) &
zips_pid=$!
checked rendered &
rendered_pid=$!
wait
zips_pid= rendered_pid=
failed=""
for name in notebooks numpy2 rendered; do
  read -r status seconds < "_build/test-$name.result"
  echo "== make test-$name ($status)"
  cat "_build/test-$name.log"
  [ "$status" = passed ] || failed+=" test-$name"
  times+="  test-$name: $seconds s"$'\n'
done
times+="  the last three (notebooks, then numpy2, beside rendered): $((SECONDS - began_checks)) s"$'\n'
if [ -n "$failed" ]; then
  echo "test: failed:$failed (logs above)" >&2
  exit 1
fi
printf 'test: every stage passed in %d s\n%s' $((SECONDS - began)) "$times"
