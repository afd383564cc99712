"""Draws time per case against the floor and the baselines from a sync_bench.json.
  python3 bench/sync/plot.py RESULTS.json OUT.png   (needs matplotlib: python3-matplotlib)"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

results = json.load(open(sys.argv[1]))
rows = results["rows"]
names = [r["case"] for r in rows]
series = [("floor", "floor_seconds", "#999999"), ("shardsync", "seconds", "#1f77b4"),
          ("gather each parameter", "gather_seconds", "#d62728"),
          ("bucketed gather", "bucketed_gather_seconds", "#ff7f0e")]
if all("bucketed_p2p_seconds" in r for r in rows):  # results from before it have none
    series.append(("bucketed point-to-point", "bucketed_p2p_seconds", "#2ca02c"))
width = 0.8 / len(series)
fig, ax = plt.subplots(figsize=(11, 4.8))
for i, (label, key, color) in enumerate(series):
    xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
    ax.bar(xs, [r[key] * 1e3 for r in rows], width, label=label, color=color)
ax.set_xticks(range(len(rows)))
ax.set_xticklabels(names, rotation=12)
ax.set_ylabel("milliseconds (median of %d syncs)" % results["syncs"])
ax.set_title("Weight sync on %d x %s: ZeRO-3 (one ZeRO-1 case) into TP layouts"
             % (results.get("world", 2), results["device"]))
ax.legend()
ax.grid(axis="y", alpha=0.3)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
