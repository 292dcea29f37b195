#!/usr/bin/env bash
# CI's other-stack legs: .ci/run calls this after the main leg (Python 3.11,
# jax 0.10.2, torch 2.13.0) has printed its result. Each leg builds a throwaway
# venv with tools/run_other_stack.sh (exact versions), runs the default test
# tier there with `-n 2`, as the main leg does, and removes the venv.
#
#   tools/ci_second_leg.sh            # every leg in LEGS below
#   tools/ci_second_leg.sh 3.12       # only the legs whose Python starts so
#
# Together with the main leg, the legs cover each minor release that
# pyproject.toml admits (Python 3.11-3.13, jax 0.10-0.12, torch 2.13-2.15);
# a pin is widened only with a leg that tests it. CI runs every leg.
#
# Every leg runs even when an earlier one fails; the exit status is non-zero
# when any leg failed or ran past LEG_TIMEOUT (timeout's 124), so CI fails.
set -uo pipefail
cd "$(dirname "$0")/.."

# python  jax  torch  (orbax-checkpoint 0.12.8 on every leg, as on the main leg)
LEGS=(
  "3.12.1 0.12.1 2.15.0"
  "3.13.0 0.11.2 2.14.1"
)
# Seconds per leg, install included: about 3 minutes to install, then the
# default tier (30-50 minutes on a loaded 2-core machine; CI's run of the main
# leg and the 3.12 leg together took 35 minutes).
# CI_DEADLINE (epoch seconds; .ci/run sets it) lowers each leg's bound to the
# time left before it, so CI's 90 minutes hold even when a leg hangs; a leg
# that cannot start with 10 minutes left is reported as not run and fails.
LEG_TIMEOUT=${LEG_TIMEOUT:-3000}

# pip's configuration files may cap torch below the version a leg tests (this
# machine's /etc/xdg/pip caps it at 2.14.1; pip then refuses torch 2.15.0):
# the legs install exact versions, so an empty constraints file replaces the
# configured one. pip's other settings (indexes, find-links) still apply.
export PIP_CONSTRAINT=/dev/null

status=0
summary=()
for leg in "${LEGS[@]}"; do
  read -r py jax torch <<<"$leg"
  case "$py" in "${1:-}"*) ;; *) continue ;; esac
  bound=$LEG_TIMEOUT
  if [ -n "${CI_DEADLINE:-}" ]; then
    left=$((CI_DEADLINE - $(date +%s)))
    [ "$left" -lt "$bound" ] && bound=$left
  fi
  if [ "$bound" -lt 600 ]; then
    summary+=("python $py, jax $jax, torch $torch: not run, ${bound}s left before CI_DEADLINE")
    status=1
    continue
  fi
  echo "== other stack: python $py, jax $jax, torch $torch (default tier, -n 2, bound ${bound}s)"
  venv=$(mktemp -d -t spmdtorch-ci-leg-XXXXXX)
  start=$(date +%s)
  # --keep: this script removes the venv, also when timeout ends the run.
  timeout -s KILL "$bound" tools/run_other_stack.sh --python "$py" --jax "$jax" --torch "$torch" \
    --keep "$venv" -- -n 2
  rc=$?
  rm -rf "$venv"
  secs=$(($(date +%s) - start))
  case $rc in
    0) verdict=passed ;;
    124 | 137) verdict="ran past ${bound}s" ;;
    10) verdict="install failed" ;;
    *) verdict="tests failed (pytest status $rc)" ;;
  esac
  summary+=("python $py, jax $jax, torch $torch: $verdict in ${secs}s")
  [ $rc -eq 0 ] || status=1
done
echo "== other stacks"
printf '%s\n' "${summary[@]}"
exit $status
