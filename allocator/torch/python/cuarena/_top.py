"""``python -m cuarena top``: the live monitor (_top_app.py, needs textual), or with ``--once``
one look printed as a table (rich, which textual brings; the live screen's columns but the
history) or as JSON (``--json``: no dependency).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import _top_format as fmt
from ._monitor_scan import page_dir
from .monitor import Monitor, Sample

USAGE = "python -m cuarena top [--interval SECONDS] [--once [--json]]"
DESCRIPTION = """\
Shows every process of this user that runs cuarena (the PyTorch drop-in, the LD_PRELOAD shim,
'cuarena replay --publish'), per GPU: the GPU's total memory and what all its processes use
(NVML, through nvidia-ml-py), then per process its reserved, allocated, cached and reclaimable
memory, what a new allocation could get now, reserved/requested, the largest block it can hand
out without a driver call, driver calls per second, out-of-memory errors and a history of
reserved memory. Read from the pages the processes publish in /dev/shm; a process whose page
was not rewritten for 10 s is shown greyed as stale.
Keys: s sort column, g next GPU (or all), 0-9 a GPU by its number, a all, q quit.
The live screen needs textual: pip install textual (or pip install 'cuarena[top]')."""
TEXTUAL_MISSING = ("cuarena: error: cuarena top needs textual, which is not installed: "
                   "pip install textual (or pip install 'cuarena[top]')")
RICH_MISSING = ("cuarena: error: cuarena top --once needs rich, which is not installed: "
                "pip install rich (or pip install 'cuarena[top]'); --once --json needs neither")


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m cuarena top", usage=USAGE, description=DESCRIPTION,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between samples (default 1); with --once, between the two "
                        "samples that give driver calls/s (0: one sample, no rates)")
    p.add_argument("--once", action="store_true",
                   help="print one table (or --json) and exit")
    p.add_argument("--json", action="store_true",
                   help="with --once: one JSON document (devices, processes with every page "
                        "field, sizes in bytes, notes)")
    return p


def _have_rich() -> bool:
    try:
        import rich.console  # noqa: F401
    except ImportError:
        return False
    return True


def _have_textual() -> bool:
    try:
        import textual  # noqa: F401
    except ImportError:
        return False
    return True


def _sample_once(interval: float) -> Sample:
    with Monitor() as monitor:
        sample = monitor.sample()
        if interval > 0 and sample.processes:
            time.sleep(interval)
            sample = monitor.sample()
    return sample


def _print_table(sample: Sample) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Piped, rich would squeeze the table into 80 columns: give it room (or $COLUMNS).
    console = Console(width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 200)))
    if not sample.devices:
        console.print(f"No cuarena process of this user: no pages in {page_dir()}.")
    for number, device in enumerate(sample.devices):
        console.print(Text(fmt.device_line(device, sample, number), style="bold"))
        processes = sample.on(device)
        if not processes:
            continue
        table = Table(box=None, pad_edge=False)
        for c in fmt.COLUMNS:
            table.add_column(fmt.title(c, fmt.DEFAULT_SORT),
                             justify="right" if c.numeric else "left", width=c.width,
                             no_wrap=True, overflow="ellipsis")
        for p in fmt.sorted_rows(processes, fmt.DEFAULT_SORT):
            # Two samples make no history: no sparkline. Rich alone (no textual needed).
            style = "dim" if p.stale else ""
            table.add_row(*(Text(c.text(p), style=style,
                                 justify="right" if c.numeric else "left") for c in fmt.COLUMNS))
        console.print(table)
    for note in sample.notes:
        console.print(Text(note, style="dim"))


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.json and not args.once:
            raise _UsageError("--json needs --once (the live screen is not JSON)")
        if args.interval < 0 or (not args.once and args.interval < 0.1):
            raise _UsageError(f"--interval {args.interval:g}: expected at least "
                              f"{'0' if args.once else '0.1'} seconds")
    except _UsageError as e:
        print(f"cuarena: error: top: {e}; see python -m cuarena top --help", file=sys.stderr)
        return 2
    if not args.once and not _have_textual():
        print(TEXTUAL_MISSING, file=sys.stderr)
        return 2
    if args.once and not args.json and not _have_rich():
        print(RICH_MISSING, file=sys.stderr)
        return 2
    if args.once:
        try:
            sample = _sample_once(args.interval)
        except KeyboardInterrupt:
            return 130
        if args.json:
            json.dump(sample.as_dict(), sys.stdout, indent=2)
            print()
        else:
            _print_table(sample)
        return 0
    from ._top_app import TopApp

    with Monitor() as monitor:
        TopApp(monitor, args.interval).run()
    return 0
