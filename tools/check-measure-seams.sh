#!/usr/bin/env bash
# ctest entry `measure-seams`: no code outside the measures' own files (src/calib/measures/) tests
# which distortion measure it holds. Callers ask the measure (measures/measure.hpp) or its traits
# (headwise/calib/measure_traits.hpp): a new measure is then one file and one traits row, not a
# branch at every site that cares (issue 53: such tests were at 17 sites in 6 files).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pattern='(==|!=)[[:space:]]*(calib::)?DistortionMeasure::|case[[:space:]]+(calib::)?DistortionMeasure::|DistortionMeasure::k[A-Za-z]+[[:space:]]*(==|!=|\?)|\b(answer_aware|span_measure|gradient_measure)[[:space:]]*\(|\.(span|answer_aware|gradient_measure)\(\)'
if hits=$(grep -rnE "$pattern" src include --include='*.cpp' --include='*.hpp' --include='*.cu' |
  grep -v '^src/calib/measures/'); then
  echo "FAIL: tests of which measure is running, outside src/calib/measures/:"
  echo "$hits"
  exit 1
fi
echo "measure-seams: no test of which measure is running outside src/calib/measures/"
