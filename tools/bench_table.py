#!/usr/bin/env python3
"""Markdown table of a side-by-side benchmark: JSON lines on stdin, one per run, each with
"command", the mode field (e.g. "attention": "fused"), "wall_s" and the extra columns' fields.

    bench_table.py MODE_FIELD BASE OTHER [FIELD:LABEL:SCALE:FORMAT ...]

Per command: median wall time of BASE and OTHER, the speed-up OTHER / BASE, then each extra
field's medians (divided by SCALE, printed with FORMAT) as "BASE / OTHER".
"""
import json
import statistics
import sys


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    field, base, other = sys.argv[1:4]
    extras = [spec.split(":") for spec in sys.argv[4:]]
    rows = [json.loads(line) for line in sys.stdin if line.strip()]
    header = ["command", f"wall s ({base} / {other})", "speed-up"] + [label for _, label, _, _ in extras]
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * (len(header) - 1))
    for name in dict.fromkeys(r["command"] for r in rows):
        runs = {mode: [r for r in rows if r["command"] == name and r[field] == mode] for mode in (base, other)}

        def median(mode: str, key: str, scale: float = 1.0) -> float:
            return statistics.median(r[key] for r in runs[mode]) / scale

        cells = [name, f"{median(base, 'wall_s'):.1f} / {median(other, 'wall_s'):.1f}",
                 f"{median(other, 'wall_s') / median(base, 'wall_s'):.2f}"]
        for key, _, scale, fmt in extras:
            cells.append(f"{median(base, key, float(scale)):{fmt}} / {median(other, key, float(scale)):{fmt}}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
