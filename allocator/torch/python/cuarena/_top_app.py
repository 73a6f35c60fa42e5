"""``python -m cuarena top``'s live screen: a textual app that samples a
:class:`~cuarena.monitor.Monitor` about once a second and shows, per device, its header line
and a table of the cuarena processes on it (with textual's DataTable, and its sparkline
renderable for the history of reserved memory). Imported only where textual is installed.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.color import Color
from textual.containers import VerticalScroll
from textual.renderables.sparkline import Sparkline
from textual.widgets import DataTable, Footer, Header, Static

from . import _top_format as fmt
from .monitor import Device, Monitor, Process, Sample

LOW = Color.parse("#3a7bd5").rich_color  # the sparkline's colour at its lowest value
HIGH = Color.parse("#e0474c").rich_color  # and at its highest
GREY = Color.parse("#707070").rich_color  # both, for a stale page


def cells(p: Process) -> list[object]:
    """A row of the table: text cells (dim for a stale page) and the sparkline."""
    style = "dim" if p.stale else ""
    row: list[object] = [Text(c.text(p), style=style, justify="right" if c.numeric else "left",
                              no_wrap=True, overflow="ellipsis") for c in fmt.COLUMNS]
    row.append(Sparkline(p.reserved_history, width=fmt.HISTORY_WIDTH,
                         min_color=GREY if p.stale else LOW, max_color=GREY if p.stale else HIGH))
    return row


def fill(table: DataTable, processes: list[Process], sort_key: str) -> None:
    table.clear(columns=True)
    for c in fmt.COLUMNS:
        table.add_column(Text(fmt.title(c, sort_key), justify="right" if c.numeric else "left"),
                         key=c.key, width=c.width)
    table.add_column(fmt.HISTORY_TITLE, key="history", width=fmt.HISTORY_WIDTH)
    for p in fmt.sorted_rows(processes, sort_key):
        table.add_row(*cells(p), key=f"{p.page.pid}.{p.page.device}")


class TopApp(App):
    """The live monitor. Keys: s cycles the sort column, g cycles the device shown (all, then
    each), 0-9 pick a device by its number, a shows all, q quits."""

    TITLE = "cuarena top"
    CSS = """
    .device { padding: 1 1 0 1; text-style: bold; }
    DataTable { height: auto; max-height: 100%; }
    .empty { padding: 1; }
    #notes { height: auto; padding: 0 1; color: $text-muted; }
    """
    BINDINGS = [
        Binding("s", "sort", "sort column"),
        Binding("g", "next_device", "next GPU"),
        Binding("a", "device(-1)", "all GPUs"),
        *[Binding(str(n), f"device({n})", f"GPU {n}", show=False) for n in range(10)],
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, monitor: Monitor, interval: float) -> None:
        super().__init__()
        self.monitor = monitor
        self.interval = interval
        self.sort_key = fmt.DEFAULT_SORT
        self.selected: str | None = None  # the key of the device shown; None: all
        self.sample: Sample | None = None
        self._shown: list[str] | None = None  # device keys that have widgets, in order
        self._widgets: dict[str, tuple[Static, DataTable]] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield VerticalScroll(id="devices")
        yield Static(id="notes")
        yield Footer()

    def on_mount(self) -> None:
        self.take_sample()
        self.set_interval(self.interval, self.take_sample)

    def take_sample(self) -> None:
        self.sample = self.monitor.sample()
        self.show()

    def _subtitle(self, devices: list[Device]) -> str:
        sort = fmt.column(self.sort_key).title
        where = "all devices" if self.selected is None else devices[0].label
        return (f"{where} · sorted by {sort} · every {self.interval:g} s · "
                f"{self.monitor.directory}")

    def show(self) -> None:
        sample = self.sample
        if sample is None:
            return
        devices = [d for d in sample.devices if d.key == self.selected]
        if not devices:  # all, or the device shown is gone (its last process ended)
            self.selected = None
            devices = sample.devices
        self.sub_title = self._subtitle(devices)
        keys = [d.key for d in devices]
        container = self.query_one("#devices", VerticalScroll)
        if keys != self._shown:
            container.remove_children()
            self._widgets = {k: (Static(classes="device"), DataTable(cursor_type="none",
                                                                     zebra_stripes=True))
                             for k in keys}
            widgets = [w for k in keys for w in self._widgets[k]]
            if not keys:
                widgets = [Static(f"No cuarena process of this user: no pages in "
                                  f"{self.monitor.directory}.", classes="empty")]
            container.mount_all(widgets)
            self._shown = keys
        for device in devices:
            line, table = self._widgets[device.key]
            line.update(fmt.device_line(device, sample, sample.devices.index(device)))
            fill(table, sample.on(device), self.sort_key)
        self.query_one("#notes", Static).update("\n".join(sample.notes))

    def action_sort(self) -> None:
        keys = [c.key for c in fmt.COLUMNS]
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.show()

    def action_next_device(self) -> None:
        keys = [d.key for d in self.sample.devices] if self.sample else []
        at = keys.index(self.selected) if self.selected in keys else -1
        self.selected = keys[at + 1] if at + 1 < len(keys) else None
        self.show()

    def action_device(self, number: int) -> None:
        """Shows the device numbered `number` in the list (-1: all)."""
        count = len(self.sample.devices) if self.sample else 0
        if number >= count:
            self.notify(f"no device {number}: there {'is' if count == 1 else 'are'} {count}",
                        severity="warning")
            return
        self.selected = None if number < 0 else self.sample.devices[number].key
        self.show()
