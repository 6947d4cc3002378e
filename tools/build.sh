#!/usr/bin/env bash
# Configures and builds headwise into build/: every target (build/bin/headwise-calc, the test
# binary), or only the targets named (`tools/build.sh headwise-calc`: the CLI and its library).
# With ccache installed, compiles go through it with the clone as its base dir (set
# CMAKE_CXX_COMPILER_LAUNCHER= to build without it); see below for what it can and cannot reuse.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/tools/setup.sh"
jobs=${HEADWISE_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}  # nproc reads OMP_NUM_THREADS
if [[ -z ${CMAKE_CXX_COMPILER_LAUNCHER+set} ]] && command -v ccache >/dev/null; then
  # Read by CMake at the first configure of build/ only.
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
# Paths under the clone hash as relative ones: the same sources hit in any checkout.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
# Every library and test source is compiled with CMake's precompiled header: without this
# sloppiness ccache refuses each such compile ("could not use precompiled header": 136 of 147 on
# a new machine), so not even a rebuild in the same folder hit.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
# ccache hashes the working directory into every nvcc compile (not only -g ones, as for g++), so
# attention_cuda.cu missed in every new clone and its 2-3 minute compile held back the library's
# link; no compile here writes debug info, so the directory changes nothing in the object.
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
# A hit hashes every input, the 430 MB precompiled header included: 1.2 s per object, the whole
# warm build's time. The inode cache hashes the header once per clone (docs/hardening.md).
export CCACHE_INODECACHE=${CCACHE_INODECACHE:-1}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j "$jobs" "$@"
