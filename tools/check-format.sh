#!/usr/bin/env bash
# The 100-column style of .clang-format, enforced: every tracked C++/CUDA source under include/,
# src/ and tests/ must be exactly what clang-format (the version pinned in versions.env) makes of
# it. Lists the files that differ and exits 1; `tools/check-format.sh --fix` rewrites them.
# ctest entry `format` (tools/test.sh, CI).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=../versions.env
source versions.env
formatter=clang-format-${CLANG_FORMAT_MAJOR}
command -v "$formatter" >/dev/null || { echo "check-format: $formatter not found (tools/setup.sh installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files -- 'include/*.hpp' 'src/*.cpp' 'src/*.hpp' 'src/*.cu' 'src/*.cuh' \
                                     'tests/*.cpp' 'tests/*.hpp' | grep -v '^tests/fixtures/')
if [[ ${1:-} == --fix ]]; then
  "$formatter" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$formatter" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'check-format: not formatted (%s; tools/check-format.sh --fix): %s\n' "$formatter" "${bad[*]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted ($formatter, 100 columns)"
