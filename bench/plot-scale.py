#!/usr/bin/env python3
"""Draws issue 37's two curves from the tables the scale benchmarks wrote: frozen time against
the number of processes (docs/bench-scale.md for ckpt, docs/bench-anchors.md for CRIU and DMTCP
on the same job) and coordination time against the number of agents (docs/bench-coord-scale.md,
without and with relays). Each point is the mean of the checkpoints a row lists (a range counts
as its middle).

Usage: bench/plot-scale.py [OUT.png]   (default docs/scale.png; needs matplotlib)
"""
import re
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs"


def tables(name):
    """The markdown tables of docs/NAME, each as (header cells, rows of cells)."""
    out, current = [], None
    for line in (DOCS / name).read_text().splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if current is None:
            current = (cells, [])
            out.append(current)
        elif not set("".join(cells)) <= set("-"):
            current[1].append(cells)
    return out


def mean_of(cell):
    """The mean of the numbers a cell lists ("12 / 15 / 9", "60-62": 61)."""
    values = []
    for part in cell.split("/"):
        numbers = [float(n.replace(",", "")) for n in re.findall(r"[\d,]+(?:\.\d+)?", part)]
        if numbers:
            values.append(statistics.mean(numbers[:2]))
    return statistics.mean(values) if values else float("nan")


def column(table, starts):
    header, rows = table
    k = next(i for i, h in enumerate(header) if h.startswith(starts))
    return [(float(r[0]), mean_of(r[k])) for r in rows]


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS / "scale.png"
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))

    series = [(column(tables("bench-scale.md")[0], "frozen ms"), "ckpt (frozen)", "tab:blue")]
    anchors = tables("bench-anchors.md")[0]
    series.append((column(anchors, "CRIU"), "CRIU 4.2 (dump)", "tab:red"))
    series.append((column(anchors, "DMTCP"), "DMTCP 4.2.0 (checkpoint)", "tab:gray"))
    for points, label, color in series:
        left.plot(*zip(*points), marker="o", label=label, color=color)
    left.set(xscale="log", yscale="log", xlabel="processes (8 MiB each)", ylabel="ms the job is stopped", title="Frozen time against processes")
    left.set_xticks([p[0] for p in series[0][0]], [f"{p[0]:.0f}" for p in series[0][0]])
    left.minorticks_off()
    left.legend()

    coord = tables("bench-coord-scale.md")
    right.plot(*zip(*column(coord[0], "coordination ms")), marker="o", label="one coordinator", color="tab:blue")
    right.plot(*zip(*column(coord[1], "coordination ms")), marker="o", label="behind relays", color="tab:green")
    right.axhline(200, color="black", linestyle=":", label="goal at 4,096")
    right.set(xscale="log", yscale="log", xlabel="agents (nodes)", ylabel="ms", title="Coordination time against agents")
    agents = [p[0] for p in column(coord[0], "coordination ms")]
    right.set_xticks(agents, [f"{a:,.0f}" for a in agents])
    right.minorticks_off()
    right.legend()

    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(out)


if __name__ == "__main__":
    main()
