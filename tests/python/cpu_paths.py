"""The CPU kernels libheadwise pins, for the Python side of a comparison against headwise-calc.

libheadwise pins MKL's code branch, ATen's kernels and oneDNN's ISA when it loads
(src/core/reproducible_math.cpp, pin_cpu_math_threads): MKL_CBWR=AVX2,STRICT (COMPATIBLE,STRICT
with HEADWISE_MKL_BRANCH=COMPATIBLE) and, on CPUs with AVX2 and FMA, ATEN_CPU_CAPABILITY=avx2 and
ONEDNN_MAX_CPU_ISA=AVX2, overwriting the environment, unless HEADWISE_MKL_STRICT=0. A Python
reference computed with torch's own choice (AVX-512 kernels on a Xeon) then differs from
headwise-calc's output by the kernels alone. `pin()` sets the same variables, by the same rule, in
this process (and so in the processes it starts); each library reads its variable once, when it
sets itself up, so it must run before torch is imported. Import this module first and call pin().
"""
import os
import sys


def _cpu_flags() -> set:
    """The `flags` of /proc/cpuinfo's first processor (empty where there is none: not Linux x86)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def pinned_environment(environ=os.environ) -> dict:
    """The variables libheadwise sets when it loads, given the environment it finds."""
    if environ.get("HEADWISE_MKL_STRICT") == "0":
        return {}
    branch = "COMPATIBLE,STRICT" if environ.get("HEADWISE_MKL_BRANCH") == "COMPATIBLE" else "AVX2,STRICT"
    env = {"MKL_CBWR": branch}
    if {"avx2", "fma"} <= _cpu_flags():
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    return env


def pin() -> dict:
    """Sets libheadwise's pinned variables in this process (overwriting, as libheadwise does);
    returns them. Fails if torch is already imported: it would keep the kernels it chose."""
    if "torch" in sys.modules:
        raise RuntimeError("cpu_paths.pin() must run before torch is imported (ATen and MKL read the "
                           "variables once)")
    env = pinned_environment()
    os.environ.update(env)
    return env
