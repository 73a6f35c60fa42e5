#!/usr/bin/env python3
"""Draws `cuarena replay --report`: reserved memory over the replay for each row (allocator) and
the requested memory once, each peak marked, one plot per trace, from the rows' JSON with their
series (`cuarena replay --json F --series` writes the same). A .png holds the plot alone; a
.html page holds it (embedded) beside the rows' table.

    report.py --check            exit 0 when matplotlib can be imported, else 2 with one line
    report.py RESULTS.json OUT   OUT ends in .png or .html

Every failure it foresees is one stderr line "cuarena-report: ..." and exit 2 (no traceback),
and OUT is written beside itself and renamed, so a failed write leaves no file.
"""

import base64
import html
import io
import json
import os
import sys
import tempfile
from pathlib import Path

GiB = float(1 << 30)
# Colours for the rows, in order; the requested line is black.
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#637939"]


class ReportError(Exception):
    pass


def load_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as e:
        module = (getattr(e, "name", None) or "matplotlib").split(".")[0]
        raise ReportError(
            f"drawing needs the Python module '{module}', which {sys.executable} cannot import "
            f"({e}); install matplotlib for it ('{sys.executable} -m pip install matplotlib', "
            f"or Debian's python3-matplotlib)") from None
    return plt


def format_bytes(n):
    """As cuarena's format_bytes: '512 B', '1.50 GiB'."""
    v, unit = float(n), 0
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    while v >= 1024.0 and unit < 4:
        v /= 1024.0
        unit += 1
    return f"{int(n)} B" if unit == 0 else f"{v:.2f} {units[unit]}"


def row_label(r):
    return r["allocator"] + ("" if r["backend"] == "trace" else f" on {r['backend']}")


def groups(results):
    """(trace name, its rows) in the order the rows come."""
    out = {}
    for r in results:
        out.setdefault(r["trace"], []).append(r)
    return list(out.items())


def draw(plt, results):
    """The figure as PNG bytes: one plot per trace with series."""
    plotted = [(name, [r for r in rows if r.get("series", {}).get("event")])
               for name, rows in groups(results)]
    plotted = [(name, rows) for name, rows in plotted if rows]
    if not plotted:
        raise ReportError("no row has a series to draw")
    fig, axes = plt.subplots(len(plotted), 1, figsize=(10, 4.6 * len(plotted)), squeeze=False)
    for ax, (name, rows) in zip(axes[:, 0], plotted):
        draw_trace(ax, name, rows)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", pad_inches=0.15,
                metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def draw_trace(ax, name, rows):
    top = 0.0
    first = rows[0]["series"]
    for i, r in enumerate(rows):
        s, colour = r["series"], COLOURS[i % len(COLOURS)]
        x, y = s["event"], [b / GiB for b in s["reserved_bytes"]]
        label = (f"{row_label(r)}: peak {format_bytes(r['peak_reserved_bytes'])} "
                 f"({r['reserved_ratio']:.4f}x requested)")
        if r.get("ooms"):
            label += f", {r['ooms']} failed allocation{'s' if r['ooms'] > 1 else ''} (X marks the first)"
        # The recording is drawn wide and pale, so a model that reproduces it shows on top.
        wide = r["allocator"] == "recorded"
        ax.plot(x, y, color=colour, linewidth=4.0 if wide else 1.3, alpha=0.45 if wide else 1.0,
                label=label, zorder=3)
        k = max(range(len(y)), key=y.__getitem__)  # the first point at the peak
        ax.plot([x[k]], [y[k]], "o", color=colour, markersize=6, zorder=5,
                markeredgecolor="white")
        oom = r.get("first_oom")
        if oom:  # where the replay first ran out of memory
            j = next((j for j, e in enumerate(x) if e >= oom["event"]), len(x) - 1)
            ax.plot([x[j]], [y[j]], "X", color=colour, markersize=9, zorder=6,
                    markeredgecolor="black")
        top = max(top, max(y))
    req = [b / GiB for b in first["requested_bytes"]]
    k = max(range(len(req)), key=req.__getitem__)
    ax.plot(first["event"], req, "--", color="black", linewidth=1.0, zorder=4,
            label=f"requested: peak {format_bytes(rows[0]['peak_requested_bytes'])}")
    ax.plot([first["event"][k]], [req[k]], "o", color="black", markersize=5, zorder=5,
            markeredgecolor="white")
    top = max(top, max(req))
    # The device limit of a --capacity run, where it is near enough to read the plot beside it.
    caps = {r["capacity_bytes"] for r in rows if r.get("verdict") and r.get("capacity_bytes")}
    for cap in sorted(caps):
        if cap / GiB <= 1.6 * top:
            ax.axhline(cap / GiB, color="#b00000", linestyle=":", linewidth=1.2, zorder=2,
                       label=f"capacity {format_bytes(cap)}")
            top = max(top, cap / GiB)
    ax.set_ylim(0, top * 1.08 if top > 0 else 1)
    ax.set_xlim(0, max(first["event"][-1], 1))
    xlabel = "event"
    times = first.get("time_us")
    if times and times[-1] > times[0]:
        xlabel += f" (trace time {(times[-1] - times[0]) / 1e6:.3g} s)"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("GiB")
    ax.set_title(f"{name}: reserved by each allocator, requested dashed; peaks marked",
                 fontsize=10)
    ax.grid(True, color="#dddddd", linewidth=0.6, zorder=0)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8.5,
              frameon=False)


NUMERIC = {"peak requested", "peak reserved", "ratio", "min capacity", "ext.frag", "OOMs"}


def table_html(results):
    any_min = any("min_capacity_bytes" in r for r in results)
    any_verdict = any(r.get("verdict") for r in results)
    head = ["trace", "allocator", "backend", "peak requested", "peak reserved", "ratio"]
    if any_min:
        head.append("min capacity")
    head += ["ext.frag", "OOMs"]
    if any_verdict:
        head.append("verdict")
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for r in results:
        cells = [r["trace"], r["allocator"], r["backend"], format_bytes(r["peak_requested_bytes"]),
                 format_bytes(r["peak_reserved_bytes"]), f"{r['reserved_ratio']:.4f}"]
        if any_min:
            m = r.get("min_capacity_bytes")
            cells.append(format_bytes(m) if m is not None else "-")
        cells += [f"{r['external_fragmentation']:.3f}", str(r["ooms"])]
        if any_verdict:
            cells.append(r.get("verdict", ""))
        out.append("<tr>" + "".join(
            f"<td class=\"num\">{html.escape(c)}</td>" if h in NUMERIC
            else f"<td>{html.escape(c)}</td>" for h, c in zip(head, cells)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>cuarena replay: {title}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
.report {{ display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }}
.report img {{ max-width: 100%; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
td.num {{ text-align: right; white-space: nowrap; }}
th {{ background: #f2f2f2; }}
p.note {{ font-size: 0.85em; color: #555; max-width: 60em; }}
</style>
</head>
<body>
<h1>cuarena replay: {title}</h1>
<div class="report">
<img alt="reserved and requested memory over the replay" src="data:image/png;base64,{png}">
<div>
{table}
<p class="note">ratio: peak reserved / peak requested (1.0 is the floor for a replay without
out-of-memory failures). Each line is an allocator's reserved memory over the trace's events,
the largest value in each window of events, so no peak is lost; the dashed line is the memory
the program requested; dots mark the peaks, crosses the first failed allocation.</p>
</div>
</div>
</body>
</html>
"""


def write_atomically(out, data):
    """Writes `data` beside `out` and renames it into place: a failure leaves no file."""
    out = Path(out)
    fd, tmp = tempfile.mkstemp(dir=str(out.parent), prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # as open() would make it
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv):
    if argv == ["--check"]:
        load_pyplot()
        return 0
    if len(argv) != 2:
        raise ReportError("usage: report.py --check | report.py RESULTS.json OUT.png|OUT.html")
    src, out = argv
    kind = Path(out).suffix.lower()
    if kind not in (".png", ".html"):
        raise ReportError(f"{out}: give a file name ending in .html or .png")
    try:
        results = json.loads(Path(src).read_text())["results"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReportError(f"{src}: not a cuarena results file ({e})") from None
    png = draw(load_pyplot(), results)
    if kind == ".png":
        data = png
    else:
        names = list(dict.fromkeys(r["trace"] for r in results))
        data = PAGE.format(title=html.escape(", ".join(names)),
                           png=base64.b64encode(png).decode("ascii"),
                           table=table_html(results)).encode("utf-8")
    try:
        write_atomically(out, data)
    except OSError as e:
        raise ReportError(f"cannot write {out}: {e.strerror or e}") from None
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ReportError as e:
        print(f"cuarena-report: {e}", file=sys.stderr)
        sys.exit(2)
