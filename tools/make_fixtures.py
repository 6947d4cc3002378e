#!/usr/bin/env python3
"""Builds tiny random-weight Hugging Face checkpoints and their reference logits.

This is headwise's independent check of forward parity: `transformers` (pinned in
versions.env) builds each architecture from a small config with random weights, saves
config.json + model.safetensors, and records the logits of a fixed input. The C++ tests
load the same checkpoint and must reproduce those logits. Never edit a reference by hand:
rerun this script.

Each family lives in tools/fixtures/<family>.py and exposes FIXTURES, a list of
`Fixture` objects (see tools/fixtures/common.py).

Usage: tools/make_fixtures.py [--only NAME ...] [--out tests/fixtures]
"""
import argparse
import importlib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from fixtures.common import build_fixture, check_versions  # noqa: E402


def all_fixtures():
    fixtures = []
    for path in sorted((ROOT / "tools" / "fixtures").glob("*.py")):
        if path.stem in ("common", "__init__"):
            continue
        module = importlib.import_module(f"fixtures.{path.stem}")
        fixtures.extend(getattr(module, "FIXTURES", []))
    return fixtures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="fixture names to (re)build")
    parser.add_argument("--out", default=str(ROOT / "tests" / "fixtures"))
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    check_versions()
    fixtures = all_fixtures()
    if args.list:
        for f in fixtures:
            print(f.name)
        return
    names = {f.name for f in fixtures}
    for name in args.only or []:
        if name not in names:
            sys.exit(f"make_fixtures: unknown fixture '{name}' (have: {', '.join(sorted(names))})")
    for fixture in fixtures:
        if args.only and fixture.name not in args.only:
            continue
        build_fixture(fixture, pathlib.Path(args.out) / fixture.name)


if __name__ == "__main__":
    main()
