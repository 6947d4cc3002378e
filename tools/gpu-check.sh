#!/usr/bin/env bash
# GPU check for the device machine (one H200, torch 2.11 + CUDA 13, nvcc, cmake, ninja; no
# network). Builds headwise against that machine's torch, runs the [gpu] tests (CUDA kernel
# vs CPU path) and the streaming/measure tests, then tools/bench-calib on CUDA, and prints a
# summary. Planned to finish in under 8 minutes; later stages are skipped when time runs out.
#
# Prepare here first:   tools/gpu-prepare.sh          (Debian headers/libs → .gpu-debs/)
# Then, with the device tool:
#   run(carry=[".gpu-debs"], timeout_s=600, command="tools/gpu-check.sh")
# Logs and JSON land in $OUT (the device tool's return folder) when set, else in out/gpu/.
# Record the printed figures, with date and commit, in docs/performance.md.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/out/gpu}
mkdir -p "$out"
budget_s=${HEADWISE_GPU_BUDGET_S:-450}  # stop starting new stages after this
log() { echo "[gpu-check ${SECONDS}s] $*"; }
summary=()

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"

# Debian build dependencies, unpacked into a private prefix (never into /: that can break
# the machine's own libraries).
prefix=/tmp/headwise-deps
if [[ -d .gpu-debs ]]; then
  mkdir -p "$prefix"
  for f in .gpu-debs/*.deb; do dpkg -x "$f" "$prefix"; done
  # .pc files name /usr; point them at the prefix.
  sed -i -E "s#^([A-Za-z_]+[[:space:]]*=[[:space:]]*)/usr#\1$prefix/usr#" \
    "$prefix"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc 2>/dev/null
  export PATH=$prefix/usr/bin:$PATH
  export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake_prefix=(-DCMAKE_PREFIX_PATH="$prefix/usr")
else
  log "no .gpu-debs/: relying on the machine's own headers (run tools/gpu-prepare.sh here to carry them)"
  cmake_prefix=()
fi

log "configure"
if ! cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTORCH_CUDA_ARCH_LIST=9.0 "${cmake_prefix[@]}" >"$out/configure.log" 2>&1; then
  tail -40 "$out/configure.log"
  exit 1
fi
grep "CUDA kernels" "$out/configure.log"
log "build"
if ! ninja -C build-gpu -j "$(nproc)" >"$out/build.log" 2>&1; then
  grep -E "error|Error" -A3 "$out/build.log" | head -60
  exit 1
fi
log "built"

# The [gpu] tests compare the kernel with the CPU path; [measure] and [arch] cover the CPU
# multi-window pass and layer streaming on this machine too.
for tag in gpu measure arch calib; do
  if build-gpu/bin/headwise-tests "[$tag]" >"$out/test-$tag.log" 2>&1; then result=pass; else result=FAIL; fi
  tail -3 "$out/test-$tag.log"
  summary+=("tests [$tag]: $result ($(grep -E '^(All tests passed|test cases:)' "$out/test-$tag.log" | tail -1))")
  log "tests [$tag] $result"
done
build-gpu/bin/headwise-tests "[gpu]" -s 2>&1 | grep -E "WARN|skipped" | head -3

export HEADWISE_CALC=$root/build-gpu/bin/headwise-calc
bench() {  # name, args...
  local name=$1
  shift
  if ((SECONDS > budget_s)); then
    summary+=("bench $name: skipped (time budget)")
    return
  fi
  log "bench $name: $*"
  if tools/bench-calib "$@" --json >"$out/bench-$name.json" 2>"$out/bench-$name.log"; then
    summary+=("bench $name: $(cat "$out/bench-$name.json")")
  else
    tail -20 "$out/bench-$name.log"
    summary+=("bench $name: FAILED (see bench-$name.log)")
  fi
}
bench quick-cuda --quick --device cuda
bench full-cuda --device cuda --seq-len 16k --samples 4 --attention-steps 32768
bench quick-cpu --quick --device cpu --skip-seqcalib

echo
echo "== gpu-check summary ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), ${SECONDS}s) =="
printf '%s\n' "${summary[@]}"
