"""`cuarena.monitor` and `python -m cuarena top`: pages written as monitor_page.hpp lays them out
(monitor_publisher.py, a publisher in Python) are read back field for field; pages of dead
processes are removed, unknown ones ignored, torn ones read again; `--once --json` and
`--once` print them; and the live screen, run in tmux, shows a publishing process and quits on
`q`. No GPU, torch or library is needed; NVML is faked where it matters. The live-screen and
table tests skip, saying why, where textual or tmux is missing (tools/install-deps.sh installs
both).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from monitor_publisher import FIELDS, GiB, MiB, Publisher, defaults, page_name
from test_package import PACKAGE_ROOT, REPO, clean_env

from cuarena import _monitor_page, _monitor_scan, _top_format, monitor  # noqa: E402

HEADER = REPO / "allocator" / "monitor" / "include" / "cuarena" / "monitor_page.hpp"
PUBLISHER = Path(__file__).with_name("monitor_publisher.py")


def have_textual():
    try:
        import textual  # noqa: F401
    except ImportError:
        return False
    return True


needs_textual = pytest.mark.skipif(not have_textual(),
                                   reason="textual is not installed (pip install textual)")


# --- The format, against the header ------------------------------------------------------------

def header_layout():
    """[(field, offset stated, bytes)] from monitor_page.hpp's MonitorPage, and its constants."""
    sizes = {"char": 1, "std::int32_t": 4, "std::uint32_t": 4, "std::int64_t": 8,
             "std::uint64_t": 8}
    decl = re.compile(r"^\s*(char|std::u?int\d+_t)\s+(\w+)(?:\[(\d+)\])?;\s*(?:///<\s*(\d+)\b)?")
    fields, pending = [], None
    text = HEADER.read_text()
    body = text[text.index("struct MonitorPage {"):text.index("};", text.index("struct Mon"))]
    for line in body.splitlines():
        m = re.match(r"^\s*/// (\d+):", line)
        if m:
            pending = int(m[1])
            continue
        m = decl.match(line)
        if m:
            offset = int(m[4]) if m[4] is not None else pending
            fields.append((m[2], offset, sizes[m[1]] * int(m[3] or 1)))
            pending = None
    constants = {
        "version": int(re.search(r"kMonitorVersion = (\d+);", text)[1]),
        "page_file_bytes": int(re.search(r"kMonitorPageBytes = (\d+);", text)[1]),
        "magic": "".join(re.findall(r"'(\w)'", re.search(r"kMonitorMagic\[8\] = \{(.*)\};",
                                                          text)[1])),
        "sizeof": int(re.search(r"sizeof\(MonitorPage\) == (\d+)", text)[1]),
    }
    return fields, constants


def test_reader_and_test_publisher_follow_the_header():
    fields, constants = header_layout()
    assert len(fields) == 29 and fields[-1][0] == "spare"
    offset = 0
    for name, stated, size in fields:  # the header's own offsets: consecutive, no padding
        assert stated == offset, name
        offset += size
    assert offset == constants["sizeof"] == _monitor_page.LAYOUT_BYTES
    assert [(n, o) for n, o, _ in fields] == list(_monitor_page.OFFSETS.items())
    assert [(n, o) for n, o, _ in fields[:-1]] == [(n, o) for n, (o, _) in FIELDS.items()]
    assert constants["version"] == _monitor_page.VERSION
    assert constants["page_file_bytes"] == _monitor_page.PAGE_FILE_BYTES
    assert constants["magic"].encode() == _monitor_page.MAGIC


# --- Reading pages -----------------------------------------------------------------------------

@pytest.fixture
def pages(tmp_path):
    """A folder for pages; publishers made with it are closed at the end."""
    made = []

    def publish(**fields):
        p = Publisher(tmp_path, **fields)
        made.append(p)
        return p

    publish.dir = tmp_path
    yield publish
    for p in made:
        p.close(remove=False)


def test_every_field_read_back(pages):
    values = dict(pid=os.getpid(), device=3, kind=2, device_uuid="GPU-0123abcd-4567",
                  command="./my_app --size 7", reserved_bytes=11, reserved_peak_bytes=12,
                  allocated_bytes=7, allocated_peak_bytes=14, requested_bytes=4,
                  requested_peak_bytes=16, active_bytes=17, reclaimable_bytes=18,
                  largest_free_bytes=19, limit_bytes=20, available_bytes=21,
                  device_total_bytes=22, driver_calls=23, num_ooms=24, num_alloc_retries=25,
                  allocations=26, memory_first=1)
    p = pages(**values)
    found = _monitor_scan.scan(pages.dir)
    assert found.skipped == [] and found.removed == []
    [page] = found.pages
    for name, value in values.items():
        assert getattr(page, name) == value, name
    assert (page.magic, page.version, page.page_bytes) == ("CUARENAM", 1, 1096)
    assert page.seq == p.seq and page.seq % 2 == 0 and page.seq > 0
    assert page.start_ns == p.fields["start_ns"] and page.update_ns == p.fields["update_ns"]
    assert page.kind_name == "shim" and not page.simulated
    assert page.cached_bytes == 4  # reserved 11 - allocated 7
    assert page.reserved_per_requested == pytest.approx(11 / 4)
    assert page.available == 21
    d = page.as_dict()
    assert d["reserved_bytes"] == 11 and d["cached_bytes"] == 4 and d["kind_name"] == "shim"


def test_long_command_cut_and_unknown_available(pages):
    pages(command="x" * 300, available_bytes=-1, requested_bytes=0)
    [page] = monitor.processes(pages.dir)
    assert page.page.command == "x" * 256  # the field's length; the reader keeps it all
    assert page.page.available is None and page.page.reserved_per_requested is None


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_pages_of_dead_processes_are_removed(pages):
    alive = pages()
    dead = pages(pid=dead_pid())
    found = _monitor_scan.scan(pages.dir)
    assert [p.pid for p in found.pages] == [os.getpid()]
    assert found.removed == [dead.path] and not dead.path.exists()
    assert alive.path.exists()


def test_dead_pages_kept_when_asked(pages):
    dead = pages(pid=dead_pid())
    assert _monitor_scan.scan(pages.dir, remove_dead=False).pages == []
    assert dead.path.exists()


def test_page_of_a_reused_pid_is_removed(pages):
    # This process started long after the page says its publisher (same pid) began: the pid
    # was reused, the publisher is gone.
    started = _monitor_scan.process_start_s(os.getpid())
    assert started is not None and abs(started - time.time()) < 24 * 3600
    reused = pages(start_ns=int((started - 3600) * 1e9))
    found = _monitor_scan.scan(pages.dir)
    assert found.pages == [] and found.removed == [reused.path] and not reused.path.exists()


def test_unknown_pages_ignored_with_a_reason(pages):
    good = pages(device=0)
    bad_magic = pages(device=1, magic=b"NOTCUARE")
    newer = pages(device=2, version=2)
    wrong_size = pages(device=3, page_bytes=2048)
    misnamed = pages(device=4, name=page_name(os.getpid(), 5))
    short = pages.dir / page_name(os.getpid(), 6)
    short.write_bytes(b"CUARENAM" + bytes(100))
    unborn = pages.dir / page_name(os.getpid(), 7)  # created, not written yet: no reason given
    unborn.write_bytes(bytes(4096))
    other_user = pages.dir / page_name(os.getpid(), 8, uid=os.getuid() + 1)
    shutil.copy(good.path, other_user)
    (pages.dir / "unrelated.file").write_text("x")

    foreign = None
    if os.getuid() == 0:  # root can give a page to another user: one not ours is not read
        foreign = pages(device=9)
        os.chown(foreign.path, 4242, -1)

    found = _monitor_scan.scan(pages.dir)
    assert [(p.pid, p.device) for p in found.pages] == [(os.getpid(), 0)]
    reasons = {s.path.name: s.reason for s in found.skipped}
    assert set(reasons) == {p.path.name for p in (bad_magic, newer, wrong_size, misnamed)} | {
        short.name} | ({foreign.path.name} if foreign else set())
    if foreign:
        assert reasons[foreign.path.name] == "owned by uid 4242, not by this user"
    assert "magic b'NOTCUARE'" in reasons[bad_magic.path.name]
    assert "version 2" in reasons[newer.path.name]
    assert "page_bytes 2048" in reasons[wrong_size.path.name]
    assert "device 4" in reasons[misnamed.path.name] and "device 5" in reasons[misnamed.path.name]
    assert "108 bytes" in reasons[short.name]
    assert found.removed == [] and all(p.exists() for p in (bad_magic.path, short, unborn))
    # The sample says so, one line each.
    with monitor.Monitor(pages.dir, nvml=False) as m:
        notes = m.sample().notes
    assert f"{newer.path.name} ignored: version 2 (this reader knows 1: a newer cuarena wrote " \
           f"it?)" in notes


class TornBuffer(bytearray):
    """A page whose writer rewrites it while the reader copies it (once): the copy is torn and
    seq has moved on when the reader looks again."""

    def __init__(self, data, rewrite):
        super().__init__(data)
        self.rewrite = rewrite
        self.copies = 0

    def __getitem__(self, index):
        copy = super().__getitem__(index)
        self.copies += 1
        if self.copies == 1:
            self[:] = self.rewrite
        return copy


def page_bytes(pages, **fields):
    p = pages(**fields)
    return bytes(p.map[:_monitor_page.LAYOUT_BYTES]), p


def test_copy_torn_by_a_rewrite_is_taken_again(pages):
    old, p = page_bytes(pages, reserved_bytes=1 * GiB)
    p.write(reserved_bytes=2 * GiB, allocated_bytes=2 * GiB)
    new = bytes(p.map[:_monitor_page.LAYOUT_BYTES])
    buffer = TornBuffer(old, new)
    data = _monitor_page.read_consistent(buffer)
    assert buffer.copies == 2
    page = _monitor_page.decode(data)
    assert (page.reserved_bytes, page.allocated_bytes, page.seq) == (2 * GiB, 2 * GiB, p.seq)


def test_page_being_written_is_waited_for(pages):
    p = pages(reserved_bytes=1 * GiB)
    p.begin(reserved_bytes=5 * GiB)  # seq odd: half written
    timer = threading.Timer(0.02, lambda: p.finish())
    timer.start()
    try:
        page = _monitor_page.decode(_monitor_page.read_consistent(p.map))
    finally:
        timer.join()
    assert page.reserved_bytes == 5 * GiB and page.seq == p.seq


def test_page_left_half_written_is_skipped(pages):
    p = pages()
    p.begin(reserved_bytes=5 * GiB)  # its writer "died" mid-write
    assert _monitor_page.read_consistent(p.map, attempts=3, wait_s=0) is None
    found = _monitor_scan.scan(pages.dir)
    assert found.pages == [] and "always being written" in found.skipped[0].reason


def test_concurrent_rewrites_never_read_torn(pages):
    p = pages()
    names = [n for n in FIELDS
             if n.endswith("_bytes") and n not in ("page_bytes", "available_bytes")]
    stop = threading.Event()

    def writer():
        k = 0
        while not stop.is_set():
            k += 1
            p.begin()
            for name in names:  # field by field, letting the reader in between
                p.fields[name] = k * 4096
                time.sleep(0)
            p.finish()
            time.sleep(0.001)  # a real publisher rewrites a few times a second

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        seen = set()
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            data = _monitor_page.read_consistent(p.map)
            assert data is not None
            page = _monitor_page.decode(data)
            values = {getattr(page, n) for n in names}
            assert len(values) == 1, f"torn read: {values}"
            seen |= values
    finally:
        stop.set()
        thread.join()
    assert len(seen) > 3  # the reader saw many versions, each whole


# --- Monitor: staleness, rates, history, devices -----------------------------------------------

def test_stale_page_kept_and_marked(pages):
    stale = pages(device=0, update_ns=time.time_ns() - 60 * 10**9)
    fresh = pages(device=1)
    with monitor.Monitor(pages.dir, nvml=False) as m:
        m.sample()
        stale.write(update_ns=stale.fields["update_ns"] + 1, driver_calls=5000)
        fresh.write(update_ns=fresh.fields["update_ns"] + 10**8, driver_calls=1100)
        by_device = {p.page.device: p for p in m.sample().processes}
    assert by_device[0].stale and by_device[0].age_s > 59
    assert by_device[0].driver_calls_per_s is None  # unknown while stale
    assert not by_device[1].stale and by_device[1].driver_calls_per_s == pytest.approx(1000)
    assert stale.path.exists()


def test_driver_calls_per_second_and_history(pages):
    p = pages(driver_calls=1000, reserved_bytes=1 * GiB)
    t0 = p.fields["update_ns"]
    with monitor.Monitor(pages.dir, nvml=False, history=3) as m:
        first = m.sample().processes[0]
        p.write(update_ns=t0 + 500_000_000, driver_calls=1500, reserved_bytes=2 * GiB)
        second = m.sample().processes[0]
        third = m.sample().processes[0]  # not rewritten since: the last rate stands
        p.write(update_ns=t0 + 1_500_000_000, driver_calls=1500, reserved_bytes=3 * GiB)
        fourth = m.sample().processes[0]
    assert first.driver_calls_per_s is None and first.reserved_history == (1 * GiB,)
    assert second.driver_calls_per_s == pytest.approx(1000)
    assert third.driver_calls_per_s == pytest.approx(1000)
    assert fourth.driver_calls_per_s == 0
    assert fourth.reserved_history == (2 * GiB, 2 * GiB, 3 * GiB)  # the last 3 samples


def test_history_restarts_for_a_new_publisher_on_the_same_pid(pages):
    p = pages(reserved_bytes=1 * GiB)
    with monitor.Monitor(pages.dir, nvml=False) as m:
        m.sample()
        p.write(start_ns=p.fields["start_ns"] + 1, reserved_bytes=2 * GiB)
        [again] = m.sample().processes
    assert again.reserved_history == (2 * GiB,) and again.driver_calls_per_s is None


class FakeNvml:
    """pynvml with two GPUs."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus):
        self.gpus = gpus
        self.calls = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"])


def test_devices_matched_to_nvml_by_uuid(pages, monkeypatch):
    nvml = FakeNvml([{"uuid": "GPU-aaaa", "name": "NVIDIA H200", "total": 140 * GiB,
                      "used": 30 * GiB},
                     {"uuid": b"GPU-bbbb", "name": b"NVIDIA H200", "total": 140 * GiB,
                      "used": 2 * GiB}])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    pages(device=0, device_uuid="GPU-bbbb", reserved_bytes=1 * GiB)
    pages(device=1, device_uuid="GPU-zzzz-not-in-nvml", device_total_bytes=80 * GiB)
    pages(device=2, device_uuid="", kind=3, device_total_bytes=16 * GiB)
    with monitor.Monitor(pages.dir) as m:
        sample = m.sample()
    assert nvml.calls == ["init", "shutdown"] and sample.notes == []
    labels = [(d.label, d.source, d.total_bytes, d.used_bytes) for d in sample.devices]
    assert labels == [("GPU 0", "nvml", 140 * GiB, 30 * GiB),
                      ("GPU 1", "nvml", 140 * GiB, 2 * GiB),
                      ("GPU-zzzz-not", "pages", 80 * GiB, None),
                      (f"simulated device 2 of pid {os.getpid()}", "pages", 16 * GiB, None)]
    gpu0, gpu1, other, sim = sample.devices
    assert sample.on(gpu0) == [] and [p.page.device for p in sample.on(gpu1)] == [0]
    assert [p.page.device for p in sample.on(other)] == [1]
    assert [p.page.kind_name for p in sample.on(sim)] == ["replayer"]
    line = _top_format.device_line(gpu1, sample, 1)
    assert line == ("[1] GPU 1  NVIDIA H200  total 140 GiB, used 2.00 GiB by all processes  "
                    "cuarena: 1 process, 1.00 GiB reserved")
    assert "no cuarena process" in _top_format.device_line(gpu0, sample, 0)
    assert "capacity 16.0 GiB (simulated)" in _top_format.device_line(sim, sample, 3)


def test_without_nvml_a_note(pages, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    pages()
    with monitor.Monitor(pages.dir) as m:
        sample = m.sample()
    assert [p.page.pid for p in sample.processes] == [os.getpid()]
    assert sample.notes == ["NVML: the Python binding is not installed (pip install "
                            "nvidia-ml-py); devices come from the cuarena pages alone"]


def test_nvml_without_driver_a_note(pages, monkeypatch):
    nvml = FakeNvml([])

    def fail():
        raise nvml.NVMLError("Driver Not Loaded")

    nvml.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    pages()
    with monitor.Monitor(pages.dir) as m:
        sample = m.sample()
    assert len(sample.processes) == 1 and len(sample.devices) == 1
    assert sample.notes[0].startswith("NVML: Driver Not Loaded")


# --- Formatting --------------------------------------------------------------------------------

def test_sizes():
    size = _top_format.size
    assert [size(n) for n in (0, 1023, 1024, 1536, 10 * MiB + MiB // 4, 3 * GiB + 512 * MiB,
                              140 * GiB, 1023 * GiB, 2 << 40)] == [
        "0 B", "1023 B", "1.00 KiB", "1.50 KiB", "10.2 MiB", "3.50 GiB", "140 GiB", "1023 GiB",
        "2.00 TiB"]
    assert size(None) == "?"


def process(pid, stale=False, age_s=0.0, rate=None, **fields):
    f = defaults(pid, 0)
    f.update(fields, seq=2)
    page = _monitor_page.Page(**{k: (v.decode() if isinstance(v, bytes) else v)
                                 for k, v in f.items()})
    return monitor.Process(page, "sim", stale, age_s, rate, ())


def test_cells():
    text = {c.key: c.text for c in _top_format.COLUMNS}
    p = process(7, rate=1234.4, requested_bytes=2 * GiB, reserved_bytes=3 * GiB,
                allocated_bytes=2 * GiB + 512 * MiB, reclaimable_bytes=100 * MiB,
                available_bytes=-1, num_ooms=3)
    assert [text[k](p) for k in ("pid", "reserved", "cached", "available", "ratio", "calls",
                                 "ooms")] == ["7", "3.00 GiB", "512 MiB/100 MiB", "?", "1.500",
                                              "1234", "3"]
    assert text["calls"](process(7, rate=2.25)) == "2.2"
    assert text["calls"](process(7, stale=True, age_s=61.2)) == "stale 61 s"
    assert all(c.width >= len(_top_format.title(c, c.key)) for c in _top_format.COLUMNS)


def test_sort_orders():
    rows = [process(30, reserved_bytes=1, command="b"), process(10, reserved_bytes=3,
                                                                command="c"),
            process(20, reserved_bytes=3, command="a")]
    order = lambda key: [p.page.pid for p in _top_format.sorted_rows(rows, key)]  # noqa: E731
    assert order("reserved") == [10, 20, 30]  # largest first, ties by pid
    assert order("pid") == [10, 20, 30]
    assert order("command") == [20, 30, 10]
    assert _top_format.title(_top_format.column("reserved"), "reserved") == "reserved ▼"
    assert _top_format.title(_top_format.column("pid"), "pid") == "pid ▲"


# --- The command -------------------------------------------------------------------------------

def top_env(directory, **extra):
    return clean_env(CUARENA_MONITOR_DIR=str(directory), **extra)


def top(directory, *args, **extra):
    return subprocess.run([sys.executable, "-m", "cuarena", "top", *args],
                          env=top_env(directory, **extra), capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def publish(tmp_path):
    """Starts processes that publish a page each (monitor_publisher.py ARGS) in tmp_path, run
    from its folder (so their command line reads short); they are stopped at the end."""
    started = []

    def start(*args):
        proc = subprocess.Popen([sys.executable, PUBLISHER.name, str(tmp_path), *args],
                                cwd=PUBLISHER.parent, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def publisher(publish):
    """One process publishing a page of the defaults: torch, on a simulated device."""
    return publish()


def test_once_json(tmp_path, publisher):
    r = top(tmp_path, "--once", "--json", "--interval", "0.5")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    [p] = doc["processes"]
    assert p["pid"] == publisher.pid and p["kind_name"] == "torch" and p["device"] == 0
    assert 3 * GiB + 512 * MiB <= p["reserved_bytes"] <= 3 * GiB + 516 * MiB
    assert p["allocated_bytes"] == 3 * GiB and p["reclaimable_bytes"] == 400 * MiB
    assert p["cached_bytes"] == p["reserved_bytes"] - 3 * GiB
    assert p["reserved_per_requested"] == pytest.approx(p["reserved_bytes"] / (3 * GiB - 10 * MiB))
    assert "monitor_publisher.py" in p["command"] and p["stale"] is False
    assert 200 <= p["driver_calls_per_s"] <= 800  # 100 calls every 0.2 s
    assert len(p["reserved_history"]) == 2
    assert [d["label"] for d in doc["devices"]] == [f"simulated device 0 of pid {publisher.pid}"]
    assert doc["devices"][0]["total_bytes"] == 140 * GiB


def test_once_json_empty_needs_nothing(tmp_path):
    # --json needs neither textual nor NVML; a folder without pages gives an empty list.
    blocker = tmp_path / "block"
    (blocker / "textual").mkdir(parents=True)
    (blocker / "textual" / "__init__.py").write_text("raise ImportError('no textual here')")
    r = top(tmp_path, "--once", "--json", PYTHONPATH=os.pathsep.join([str(blocker),
                                                                      str(PACKAGE_ROOT)]))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["processes"] == []


def test_without_textual_one_line(tmp_path):
    blocker = tmp_path / "block"
    (blocker / "textual").mkdir(parents=True)
    (blocker / "textual" / "__init__.py").write_text("raise ImportError('no textual here')")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), str(PACKAGE_ROOT)])}
    r = top(tmp_path, **env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("cuarena: error: cuarena top needs textual, which is not installed: "
                        "pip install textual (or pip install 'cuarena[top]')\n")
    # One table for scripts needs rich alone (textual's own dependency, often there without it).
    r = top(tmp_path, "--once", **env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    # Without rich either: one line for the table, and JSON still works.
    (blocker / "rich").mkdir()
    (blocker / "rich" / "__init__.py").write_text("raise ImportError('no rich here')")
    r = top(tmp_path, "--once", **env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("cuarena: error: cuarena top --once needs rich") and \
        r.stderr.count("\n") == 1, r.stderr
    r = top(tmp_path, "--once", "--json", **env)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args, message", [
    (["--json"], "--json needs --once"),
    (["--interval", "0"], "--interval 0: expected at least 0.1 seconds"),
    (["--once", "--interval", "-1"], "--interval -1: expected at least 0 seconds"),
    (["--interval", "x"], "invalid float value: 'x'"),
    (["--sort"], "unrecognized arguments: --sort"),
])
def test_usage_errors_one_line(tmp_path, args, message):
    r = top(tmp_path, *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("cuarena: error: top: ")
    assert message in r.stderr


def test_help_lists_top():
    r = subprocess.run([sys.executable, "-m", "cuarena", "--help"], env=clean_env(),
                       capture_output=True, text=True, timeout=60)
    assert "python -m cuarena top [--interval SECONDS] [--once [--json]]" in r.stdout
    r = subprocess.run([sys.executable, "-m", "cuarena", "top", "--help"], env=clean_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Keys: s sort column" in r.stdout


@needs_textual
def test_once_table(tmp_path, publisher):
    r = top(tmp_path, "--once", "--interval", "0.5", COLUMNS="220")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"[0] simulated device 0 of pid {publisher.pid}  capacity "
                               f"140 GiB (simulated)  cuarena: 1 process, 3.50 GiB reserved")
    assert re.search(r"pid +command +kind +reserved ▼ +allocated", lines[1])
    row = lines[2]
    assert row.split()[:2] == [str(publisher.pid), "python3"] and "torch" in row
    assert re.search(r"3\.50 GiB +3\.00 GiB +51\d MiB/400 MiB +130 GiB +1\.17\d +256 MiB "
                     r"+\d+ +0$", row), row


@needs_textual
def test_app_keys_pick_devices_and_sort(pages):
    import asyncio

    from textual.widgets import DataTable

    from cuarena._top_app import TopApp

    pages(device=0, device_uuid="GPU-aaaa", reserved_bytes=1 * GiB)
    pages(device=1, reserved_bytes=2 * GiB)  # a simulated device
    sim = f"sim:{os.getpid()}:1"

    async def drive():
        with monitor.Monitor(pages.dir, nvml=False) as m:
            app = TopApp(m, 1.0)
            told = []
            app.notify = lambda message, **_: told.append(message)
            async with app.run_test(size=(200, 40)) as pilot:
                async def press(key):
                    await pilot.press(key)
                    await pilot.pause()
                    return app.selected, len(app.query(DataTable)), app.sub_title.split(" · ")[0]

                await pilot.pause()
                assert (app.selected, len(app.query(DataTable))) == (None, 2)
                assert await press("g") == ("GPU-aaaa", 1, "GPU-aaaa")
                assert await press("g") == (sim, 1, f"simulated device 1 of pid {os.getpid()}")
                assert await press("g") == (None, 2, "all devices")
                assert await press("1") == (sim, 1, f"simulated device 1 of pid {os.getpid()}")
                assert await press("5") == (sim, 1, f"simulated device 1 of pid {os.getpid()}")
                assert told == ["no device 5: there are 2"]
                assert await press("a") == (None, 2, "all devices")
                await press("s")
                table = app.query(DataTable).first()
                assert [str(c.label) for c in table.columns.values()][3:5] == [
                    "reserved", "allocated ▼"]
                assert "sorted by allocated" in app.sub_title
                await press("q")
            assert app.return_code == 0

    asyncio.run(drive())


# --- The live screen, in a real terminal -------------------------------------------------------

class Tmux:
    """A tmux server of this test's own (its own socket and configuration: windows of
    COLUMNS x LINES whatever tmux's sizing rules decide later), killed at the end."""

    COLUMNS, LINES = 200, 30

    def __init__(self, folder):
        self.socket = f"cuarena-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.config = folder / "tmux.conf"
        self.config.write_text(f"set -g default-size {self.COLUMNS}x{self.LINES}\n")

    def __call__(self, *args, check=True):
        return subprocess.run(["tmux", "-L", self.socket, "-f", str(self.config), *args],
                              capture_output=True, text=True, timeout=30, check=check)

    def pane(self):
        return self("capture-pane", "-p", "-t", "top").stdout

    def wait_for(self, predicate, seconds, what):
        deadline = time.monotonic() + seconds
        screen = ""
        while time.monotonic() < deadline:
            screen = self.pane() if self("has-session", "-t", "top", check=False).returncode == 0 \
                else screen
            if predicate(screen):
                return screen
            time.sleep(0.2)
        pytest.fail(f"{what} not seen within {seconds} s; the screen was:\n{screen}")

    def kill(self):
        self("kill-server", check=False)


@needs_textual
@pytest.mark.skipif(shutil.which("tmux") is None,
                    reason="tmux is not installed (apt-get install tmux)")
def test_top_in_tmux(tmp_path, publish):
    gpu = "GPU-5f3c2a1e-8d4b-4c7a-9e21-0b6d3f8a7c55"  # one NVML does not know: from the pages
    torch_job = publish("--uuid", gpu)  # 3.50 GiB reserved, 3.00 GiB allocated
    shim_job = publish("--uuid", gpu, "--kind", "2", "--reserved", str(6 * GiB),
                       "--allocated", str(2 * GiB))
    done = tmp_path / "exit-status"
    env = top_env(tmp_path)
    # COLUMNS and LINES would fix textual's idea of the terminal's size (and the tmux server
    # may have them from a parent), so they go: the pane is the terminal.
    command = " ".join(
        ["env", "-u", "COLUMNS", "-u", "LINES", *(shlex.quote(f"{k}={v}") for k, v in env.items()
                                                  if k in ("PYTHONPATH", "CUARENA_MONITOR_DIR",
                                                           "TORCH_DEVICE_BACKEND_AUTOLOAD",
                                                           "PATH", "HOME")),
         shlex.quote(sys.executable), "-m", "cuarena", "top", "--interval", "0.5",
         ";", "echo", "$?", ">", shlex.quote(str(done))])
    tmux = Tmux(tmp_path)
    try:
        tmux("new-session", "-d", "-s", "top", "-x", str(tmux.COLUMNS), "-y", str(tmux.LINES),
             "sh", "-c", command)
        size = tmux("display", "-p", "-t", "top", "#{window_width}x#{window_height}").stdout
        assert size.strip() == f"{tmux.COLUMNS}x{tmux.LINES}"
        row = re.compile(rf"^\W*{torch_job.pid} .* torch .* 3\.50 GiB .* 3\.00 GiB ", re.M)
        screen = tmux.wait_for(lambda s: row.search(s), 20, f"the row of pid {torch_job.pid}")
        assert f"[0] {gpu[:12]}  total 140 GiB (its pages say" in screen
        assert "cuarena: 2 processes, 9.50 GiB reserved" in screen
        assert "reserved ▼" in screen and "cuarena top" in screen
        # Driver calls/s appears from the second sample on (each publisher makes ~500/s).
        rate = re.compile(rf"^\W*{torch_job.pid} .* MiB +(\d+) +0 +[▁-█]+$", re.M)
        screen = tmux.wait_for(lambda s: rate.search(s), 10, "a driver calls/s figure")
        assert 200 <= int(rate.search(screen)[1]) <= 800

        def order(s):
            return [int(m[1]) for m in re.finditer(r"^\W*(\d+) +python", s, re.M)]

        assert order(screen) == [shim_job.pid, torch_job.pid]  # 6 GiB reserved, then 3.5
        if os.environ.get("CUARENA_TOP_CAPTURE"):  # for the README's picture: some history
            time.sleep(5)
            Path(os.environ["CUARENA_TOP_CAPTURE"]).write_text(tmux.pane())
        tmux("send-keys", "-t", "top", "s")  # sort by allocated: 3 GiB, then 2
        screen = tmux.wait_for(lambda s: "allocated ▼" in s and "reserved ▼" not in s, 10,
                               "the sort moved to allocated")
        assert order(screen) == [torch_job.pid, shim_job.pid]
        tmux("send-keys", "-t", "top", "q")
        deadline = time.monotonic() + 10
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done.exists(), f"top did not quit on q; the screen:\n{tmux.pane()}"
        assert done.read_text().strip() == "0"
    finally:
        tmux.kill()


def test_pyproject_has_the_top_extra():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert [re.split(r"[<>=]", r)[0] for r in extras["top"]] == ["textual", "nvidia-ml-py"]


def cuarena_cli():
    path = Path(os.environ.get("CUARENA_CLI") or REPO / "build" / "bin" / "cuarena")
    if not path.exists():
        pytest.fail(f"cuarena binary not found at {path}: build first (see README)")
    return path


def test_top_reads_the_page_a_real_replay_publishes(tmp_path):
    # The C++ publisher (MonitorPublisher, through `cuarena replay --publish`) and this reader
    # agree on the page: the row is there, of the replaying process, with its simulated device.
    env = clean_env()
    env.pop("CUARENA_MONITOR_DIR", None)  # the publisher writes /dev/shm
    replay = subprocess.Popen(
        [str(cuarena_cli()), "replay", str(REPO / "tests/data/traces/resnet50_amp.pickle.gz"),
         "--allocator", "cuarena", "--publish", "--pace", "2000", "--capacity", "16GiB"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        row, deadline = None, time.time() + 60
        while row is None and time.time() < deadline and replay.poll() is None:
            out = subprocess.run([sys.executable, "-m", "cuarena", "top", "--once", "--json",
                                  "--interval", "0.3"], capture_output=True, text=True,
                                 env=env, timeout=60)
            assert out.returncode == 0, out.stderr
            rows = [p for p in json.loads(out.stdout)["processes"] if p["pid"] == replay.pid]
            if rows and rows[0]["reserved_bytes"] > 0:
                row = rows[0]
            else:
                time.sleep(0.3)
        assert row is not None, (replay.poll(), replay.stderr.read() if replay.poll() else "")
        assert row["kind_name"] == "replayer" and row["simulated"], row
        assert row["device_total_bytes"] == 16 << 30, row
        assert 0 < row["allocated_bytes"] <= row["reserved_bytes"] <= 16 << 30, row
        assert row["requested_bytes"] <= row["allocated_bytes"], row
        assert "resnet50_amp" in row["command"], row
    finally:
        replay.kill()
        replay.wait(timeout=30)
    # Killed, its page stays; the reader drops it as the page of a dead process.
    out = subprocess.run([sys.executable, "-m", "cuarena", "top", "--once", "--json",
                          "--interval", "0.1"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert not [p for p in json.loads(out.stdout)["processes"] if p["pid"] == replay.pid]
    assert not list(Path("/dev/shm").glob(f"cuarena.*.{replay.pid}.*"))
