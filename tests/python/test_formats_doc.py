"""docs/formats.md against the replayer: each format's example file is what the page shows,
its replay command runs, and `cuarena replay --json` gives the figures the page's tables state."""

import json
import os
import pickle
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "formats.md"
EXAMPLES = REPO / "tests" / "data" / "formats"
SECTIONS = {  # heading -> example file
    "PyTorch memory snapshots": "snapshot.pickle",
    "RMM `logging_resource_adaptor` CSV logs": "rmm_log.csv",
    "cuarena traces (`.cuat`)": "trace.cuat",
}
FIGURES_HEADER = ("| trace | rows | peak requested | allocs | frees | skipped | "
                  "recorded peak reserved | recorded OOMs |")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUARENA_CACHE_DIR", str(tmp_path / "cache"))


def cli():
    path = os.environ.get("CUARENA_CLI") or str(REPO / "build" / "bin" / "cuarena")
    if not Path(path).exists():
        pytest.fail(f"cuarena binary not found at {path}: build first (see README)")
    return path


def section(heading):
    parts = re.split(r"^## ", DOC.read_text(), flags=re.M)
    [text] = [p for p in parts if p.startswith(heading + "\n")]
    return text


def fenced(text, lang):
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.M | re.S)


def figures(text):
    """The rows of the section's figures table: {trace: {column: cell}}."""
    lines = text.splitlines()
    start = lines.index(FIGURES_HEADER)
    names = [c.strip() for c in FIGURES_HEADER.strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(names, (c.strip() for c in line.strip("|").split("|"))))
        rows[cells["trace"].strip("`")] = cells
    assert rows, f"no rows under {FIGURES_HEADER}"
    return rows


def size_cell(cell):
    """'12.00 MiB (12582912)' -> ('12.00 MiB', 12582912)."""
    m = re.fullmatch(r"(\d+(?:\.\d\d)? (?:B|KiB|MiB|GiB|TiB)) \((\d+)\)", cell)
    assert m, f"not 'HUMAN (BYTES)': {cell!r}"
    return m.group(1), int(m.group(2))


@pytest.mark.parametrize("heading", SECTIONS)
def test_example_replays_to_the_documented_figures(heading, tmp_path):
    text = section(heading)
    example = SECTIONS[heading]
    commands = [c for block in fenced(text, "sh") for c in block.splitlines()
                if c.startswith("build/bin/cuarena replay ")]
    assert commands == [f"build/bin/cuarena replay tests/data/formats/{example}"]
    out = tmp_path / "out.json"
    argv = [cli(), *shlex.split(commands[0])[1:], "--json", str(out)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())["results"]
    documented = figures(text)
    assert {r["trace"] for r in results} == set(documented)
    for trace, cells in documented.items():
        rows = {r["allocator"]: r for r in results if r["trace"] == trace}
        assert list(rows) == [a.strip() for a in cells["rows"].split(",")], trace
        shown, requested = size_cell(cells["peak requested"])
        for r in rows.values():
            assert r["peak_requested_bytes"] == requested, (trace, r["allocator"])
            assert r["allocs"] == int(cells["allocs"]), (trace, r["allocator"])
            assert r["frees"] == int(cells["frees"]), (trace, r["allocator"])
            assert r["skipped_events"] == int(cells["skipped"]), (trace, r["allocator"])
        # The printed table shows the page's sizes on the trace's rows.
        lines = proc.stdout.splitlines()
        head = re.split(r"\s{2,}", lines[0].strip())
        printed = {c[1]: dict(zip(head, c)) for c in (re.split(r"\s{2,}", line.strip())
                                                     for line in lines[2:]) if c[0] == trace}
        assert list(printed) == list(rows)
        assert all(c["peak requested"] == shown for c in printed.values()), printed
        if "recorded" in rows:
            shown, reserved = size_cell(cells["recorded peak reserved"])
            assert rows["recorded"]["peak_reserved_bytes"] == reserved, trace
            assert printed["recorded"]["peak reserved"] == shown
            assert rows["recorded"]["ooms"] == int(cells["recorded OOMs"]), trace
        else:
            assert cells["recorded peak reserved"] == cells["recorded OOMs"] == "-"
            assert "no 'recorded' row" in proc.stderr


def run_python_block(text, tmp_path):
    """Runs the section's one Python block that writes a file, in tmp_path."""
    [block] = [b for b in fenced(text, "python") if "open(" in b and '"wb"' in b
               and "pickle.load" not in b]
    subprocess.run(["python3", "-c", block], cwd=tmp_path, check=True, timeout=60)


def test_snapshot_example_is_what_its_code_writes(tmp_path):
    run_python_block(section("PyTorch memory snapshots"), tmp_path)
    written = pickle.loads((tmp_path / "snapshot.pickle").read_bytes())
    assert written == pickle.loads((EXAMPLES / "snapshot.pickle").read_bytes())


def test_cuat_example_is_what_its_code_writes(tmp_path):
    run_python_block(section("cuarena traces (`.cuat`)"), tmp_path)
    assert (tmp_path / "trace.cuat").read_bytes() == (EXAMPLES / "trace.cuat").read_bytes()


def test_csv_example_is_shown_whole():
    [block] = fenced(section("RMM `logging_resource_adaptor` CSV logs"), "csv")
    assert block == (EXAMPLES / "rmm_log.csv").read_text()


def test_one_device_recipe_keeps_that_devices_rows(tmp_path):
    """The page's recipe for replaying one device of several."""
    text = section("PyTorch memory snapshots")
    [recipe] = [b for b in fenced(text, "python") if "pickle.load" in b]
    ev = {"action": "alloc", "addr": 4096, "size": 1 << 20, "stream": 0, "time_us": 0}
    (tmp_path / "job.pickle").write_bytes(
        pickle.dumps({"device_traces": [[ev], [ev, dict(ev, addr=8192)], [ev]]}))
    subprocess.run(["python3", "-c", recipe], cwd=tmp_path, check=True, timeout=60)
    out = tmp_path / "out.json"
    subprocess.run([cli(), "replay", tmp_path / "job-cuda1.pickle", "--allocator", "cuarena",
                    "--json", out], check=True, capture_output=True, timeout=300)
    [row] = json.loads(out.read_text())["results"]
    assert (row["trace"], row["device"], row["allocs"]) == ("job-cuda1:cuda1", 1, 2)


def test_links_to_the_page_and_within_it_resolve():
    headings = re.findall(r"^#+ (.+)$", DOC.read_text(), flags=re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    for readme, link in ((REPO / "README.md", "docs/formats.md"),
                         (REPO / "tools" / "replay" / "README.md", "../../docs/formats.md")):
        text = readme.read_text()
        assert f"]({link})" in text, readme
        for anchor in re.findall(rf"\]\({re.escape(link)}#([^)]+)\)", text):
            assert anchor in slugs, (readme, anchor)
    anchors = re.findall(r"\]\(#([^)]+)\)", DOC.read_text())
    assert anchors and set(anchors) <= slugs, set(anchors) - slugs
