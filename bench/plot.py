#!/usr/bin/env python3
"""Draws the results of `ckpt bench` (its results.json) as one small PNG.

Usage: plot.py RESULTS.json OUT.png     (needs matplotlib: pip install matplotlib)
"""
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def med(v):
    return statistics.median(v) if v else float("nan")


def rows(res, exp):
    return [r for r in res["rows"] if r["experiment"] == exp]


def bars(ax, labels, series, title, ylabel="ms", rotation=20):
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (name, values, color) in enumerate(series):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, values, width, label=name, color=color)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=rotation, ha="right" if rotation else "center", fontsize=7 if rotation else 6)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7)


FROZEN, DURABLE, WAIT, RESTART = "#1f77b4", "#ff7f0e", "#9467bd", "#2ca02c"


def main():
    res = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.6))
    size = f"{res['image_mib']} MiB"

    # 1. writer modes
    ax = axes[0][0]
    m = rows(res, "modes")
    if m:
        labels = [r["label"].replace(" via page cache", "\npg cache").replace(" tuned", "\ntuned")
                  .replace(", pool 1.5x image", "\n1.5x").replace(", pool 1/4 image", "\n1/4") for r in m]
        bars(ax, labels, [("frozen", [med(r["frozen_ms"]) for r in m], FROZEN),
                          ("durable", [med(r["durable_ms"]) for r in m], DURABLE)],
             f"Writer modes ({size} incompressible; pool 1.5x or 1/4)", rotation=0)

    # 2. pool size
    ax = axes[0][1]
    p = rows(res, "pool")
    if p:
        labels = [r["label"].replace("pool ", "") for r in p]
        bars(ax, labels, [("frozen", [med(r["frozen_ms"]) for r in p], FROZEN),
                          ("pool wait", [med(r["pool_wait_ms"]) for r in p], WAIT),
                          ("durable", [med(r["durable_ms"]) for r in p], DURABLE)],
             f"dbi: pool size ({size} image)")

    # 3. chunk size
    ax = axes[0][2]
    c = rows(res, "chunk")
    if c:
        labels = [r["label"].replace("chunk ", "") for r in c]
        bars(ax, labels, [("frozen", [med(r["frozen_ms"]) for r in c], FROZEN),
                          ("durable", [med(r["durable_ms"]) for r in c], DURABLE)],
             "dbi: chunk size (pool 1/4 image)")

    # 4. IO threads and wag threshold
    ax = axes[1][0]
    io = [r for r in rows(res, "io") if "compressible" not in r["label"]]
    th = rows(res, "threshold")
    if io or th:
        labels = [r["label"].replace(" IO threads", " IO thr") for r in io] + \
                 [r["label"].replace("wag, threshold ", "wag ") for r in th]
        all_rows = io + th
        bars(ax, labels, [("frozen", [med(r["frozen_ms"]) for r in all_rows], FROZEN),
                          ("durable", [med(r["durable_ms"]) for r in all_rows], DURABLE)],
             "dbi IO threads (pool 1/4) | wag threshold")

    # 5. workloads
    ax = axes[1][1]
    w = rows(res, "workloads")
    if w:
        labels = [r["label"].replace("compressible", "comp.").replace("incomp.", "incompr.")
                  .replace(" mappings of ", " maps x").replace(" processes x ", " procs x") for r in w]
        bars(ax, labels, [("frozen", [med(r["frozen_ms"]) for r in w], FROZEN),
                          ("durable", [med(r["durable_ms"]) for r in w], DURABLE),
                          ("restart", [r["restart_ms"] or 0 for r in w], RESTART)],
             "Workloads (dbi, pool 1.5x)")

    # 6. compute overhead
    ax = axes[1][2]
    comp = res.get("compute") or []
    if comp:
        base = statistics.mean(comp[0]["base_s"])
        labels = [x["label"] for x in comp]
        lost = [sum(x.get("lost_s") or []) / base * 100 for x in comp]
        total = [(x["with_s"] / base - 1) * 100 for x in comp]
        xs = range(len(comp))
        ax.bar([x - 0.2 for x in xs], lost, 0.4, color=FROZEN, label="time lost around checkpoints")
        ax.bar([x + 0.2 for x in xs], total, 0.4, color="white", edgecolor=FROZEN, hatch="//",
               label="run-time difference (noisy)")
        ax.axhline(2.0, color="gray", linestyle="--", linewidth=1)
        ax.text(len(comp) - 0.5, 2.05, "goal 2 %", fontsize=7, ha="right", va="bottom")
        ax.legend(fontsize=7)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("%", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title(f"Overhead of 3 checkpoints on a {base:.0f} s compute loop", fontsize=9)

    for row in axes:
        for ax in row:
            if not ax.has_data():
                ax.set_axis_off()
    fig.suptitle(f"ckpt bench, {res['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=72)


if __name__ == "__main__":
    main()
