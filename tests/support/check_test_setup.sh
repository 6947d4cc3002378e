#!/usr/bin/env bash
# The `test-setup` ctest entry: the suite's exit codes cannot hide a failure as a skip.
#   check_test_setup.sh HEADWISE_TESTS CTEST SKIP_CODE PYTHON3 TEST_HF_CACHE_PY
# 1. headwise-tests (tests/main.cpp) on planted hidden cases (tests/core/test_setup_test.cpp):
#    four failing assertions exit 1, an explicit skip exits SKIP_CODE, a pass 0, a skip after a
#    failure 1.
# 2. ctest, with the SKIP_RETURN_CODE every suite entry has, reports the four failures as a
#    failure (non-zero exit, "Failed") and the skip as skipped (exit 0).
# 3. tests/python/test_hf_cache.py without torch (a planted `torch` that fails to import) fails,
#    and skips only when HEADWISE_PYTHON_STACK_OPTIONAL=1.
set -uo pipefail
tests=$1 ctest=$2 skip_code=$3 python=$4 hf_test=$5
failures=0
check() {  # check WHAT EXPECTED_EXIT ACTUAL_EXIT
  if [[ $2 == "$3" ]]; then echo "ok   $1 (exit $3)"; else echo "FAIL $1: exit $3, expected $2"; failures=$((failures + 1)); fi
}
holds() {  # holds WHAT STATUS_OF_A_TEST
  if [[ $2 == 0 ]]; then echo "ok   $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}
scratch=$(mktemp -d /tmp/headwise-test-setup-XXXXXX)
trap 'rm -rf "$scratch"' EXIT

run_tests() { "$tests" "$1" >"$scratch/out.txt" 2>&1; echo $?; }
check "four failing assertions" 1 "$(run_tests '[.planted-four-failures]')"
grep -q "4 failed" "$scratch/out.txt" || { echo "FAIL the planted case did not fail four assertions:"; cat "$scratch/out.txt"; failures=$((failures + 1)); }
check "an explicit skip" "$skip_code" "$(run_tests '[.planted-skip]')"
check "a pass" 0 "$(run_tests '[.planted-pass]')"
check "a skip after a failed assertion" 1 "$(run_tests '[.planted-skip-after-failure]')"
check "a skip next to a pass (the run passes, the skip is reported)" 0 "$(run_tests '[.planted-skip],[.planted-pass]')"
grep -q "skipped 'planted: a test case that skips'" "$scratch/out.txt" || { echo "FAIL the skip is not reported"; failures=$((failures + 1)); }

# A ctest project holding the planted cases with the suite's own SKIP_RETURN_CODE.
mkdir -p "$scratch/ctest"
cat >"$scratch/ctest/CTestTestfile.cmake" <<CMAKE
add_test(planted-four-failures "$tests" "[.planted-four-failures]")
add_test(planted-skip "$tests" "[.planted-skip]")
set_tests_properties(planted-four-failures planted-skip PROPERTIES SKIP_RETURN_CODE $skip_code)
CMAKE
(cd "$scratch/ctest" && "$ctest" -R planted-four-failures >"$scratch/ctest.txt" 2>&1)
status=$?
[[ $status -ne 0 ]] && grep -q "Failed" "$scratch/ctest.txt"
holds "ctest on four failing assertions reports a failure (ctest exit $status)" $?
(cd "$scratch/ctest" && "$ctest" -R planted-skip >"$scratch/ctest.txt" 2>&1)
status=$?
[[ $status -eq 0 ]] && grep -q "Skipped" "$scratch/ctest.txt"
holds "ctest on an explicit skip reports it skipped (ctest exit $status)" $?

if [[ -n $python ]]; then
  mkdir -p "$scratch/no-torch/torch"
  echo 'raise ImportError("planted: torch is not installed")' >"$scratch/no-torch/torch/__init__.py"
  PYTHONPATH="$scratch/no-torch" env -u HEADWISE_PYTHON_STACK_OPTIONAL "$python" "$hf_test" --cli /nonexistent >/dev/null 2>&1
  check "the python entry without torch" 1 $?
  PYTHONPATH="$scratch/no-torch" HEADWISE_PYTHON_STACK_OPTIONAL=1 "$python" "$hf_test" --cli /nonexistent >/dev/null 2>&1
  check "the python entry without torch, skipping allowed" "$skip_code" $?
fi
if ((failures)); then echo "$failures check(s) failed"; exit 1; fi
echo "the test set-up cannot report a failure as a skip"
