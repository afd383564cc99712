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
# Each series: (label, the row's milliseconds, colour). Runs with --serving give one
# shardsync bar per coordinator placement; runs with --clients one more per placement for
# the other client call (hatched).
PLACEMENT = {"process": "coordinator process", "agent0": "agent 0 serving it", "agent0-unix": "agent 0, unix socket"}
BLUES = ["#1f77b4", "#17becf", "#9467bd"]
series = [("floor", lambda r: r["floor_seconds"], "#999999")]
servings = list(rows[0].get("by_serving", {}))
if servings:
    first = rows[0].get("client")
    for i, s in enumerate(servings):
        series.append((f"shardsync, {PLACEMENT[s]}" + (f", {first} call" if first else ""),
                       lambda r, s=s: r["by_serving"][s]["seconds"], BLUES[i % 3]))
        for other in rows[0]["by_serving"][s].get("clients_compared", {}):
            series.append((f"shardsync, {PLACEMENT[s]}, {other} call",
                           lambda r, s=s, o=other: r["by_serving"][s]["clients_compared"][o]["seconds"],
                           BLUES[i % 3], "//"))
else:
    series.append(("shardsync", lambda r: r["seconds"], BLUES[0]))
series += [("gather each parameter", lambda r: r["gather_seconds"], "#d62728"),
           ("bucketed gather", lambda r: r["bucketed_gather_seconds"], "#ff7f0e")]
if all("bucketed_p2p_seconds" in r for r in rows):  # results from before it have none
    series.append(("bucketed point-to-point", lambda r: r["bucketed_p2p_seconds"], "#2ca02c"))
width = 0.8 / len(series)
fig, ax = plt.subplots(figsize=(12, 5.2))
for i, (label, value, color, *hatch) in enumerate(series):
    xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
    ax.bar(xs, [value(r) * 1e3 for r in rows], width, label=label, color=color, hatch=hatch[0] if hatch else None,
           edgecolor="white" if hatch else None)
ax.set_xticks(range(len(rows)))
ax.set_xticklabels(names, rotation=12)
ax.set_ylabel("milliseconds (median of %d syncs)" % results["syncs"])
ax.set_title("Weight sync on %d x %s: ZeRO-3 into TP layouts" % (results.get("world", 2), results["device"]))
ax.legend(fontsize=8)
ax.grid(axis="y", alpha=0.3)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
