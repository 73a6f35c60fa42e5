"""`cuarena replay --series` and `--report`: the series in the JSON, the picture (PNG, or HTML with
the table), refusals (extension, --series without --json), a missing matplotlib, and a failed
write that leaves no file."""

import base64
import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import REPO, TRACES, private_cache, run  # noqa: F401 (private_cache: autouse)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SCRIPT = REPO / "tools" / "replay" / "report.py"
GPT2 = TRACES / "gpt2_train.pickle.gz"
BERT = TRACES / "bert_varlen_infer.pickle.gz"
ROWS = "recorded,torch-native-sim,torch-expandable-sim,cuarena"


def have_matplotlib():
    return subprocess.run([sys.executable, "-c", "import matplotlib"],
                          capture_output=True).returncode == 0


@pytest.fixture
def matplotlib_installed():
    if not have_matplotlib():
        if os.environ.get("CI"):
            pytest.fail("matplotlib is missing: tools/install-deps.sh installs it")
        pytest.skip("matplotlib not installed (tools/install-deps.sh installs it)")


@pytest.fixture
def no_matplotlib(tmp_path, monkeypatch):
    """A PYTHONPATH whose matplotlib raises ImportError, as an interpreter without it would."""
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ImportError(\"No module named 'matplotlib'\", name='matplotlib')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow.parent))


def test_series_in_the_json_peaks_at_each_rows_peak(tmp_path):
    out = tmp_path / "s.json"
    run("replay", GPT2, BERT, "--allocator", ROWS, "--json", out, "--series", check=True)
    results = json.loads(out.read_text())["results"]
    assert len(results) == 8
    for r in results:
        s = r["series"]
        n = len(s["event"])
        assert 0 < n <= 2000
        assert len(s["reserved_bytes"]) == len(s["requested_bytes"]) == len(s["time_us"]) == n
        steps = [b - a for a, b in zip(s["event"], s["event"][1:])]
        assert all(d == s["window"] for d in steps[:-1]) and 0 < steps[-1] <= s["window"]
        assert max(s["reserved_bytes"]) == r["peak_reserved_bytes"], r["allocator"]
        assert max(s["requested_bytes"]) == r["peak_requested_bytes"], r["allocator"]
    # Without --series the JSON is as before: no series.
    plain = tmp_path / "p.json"
    run("replay", BERT, "--json", plain, check=True)
    assert all("series" not in r for r in json.loads(plain.read_text())["results"])


def test_series_without_json_is_refused(tmp_path):
    proc = run("replay", BERT, "--series")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--json" in proc.stderr and proc.stdout == ""


def test_report_png(tmp_path, matplotlib_installed):
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "r.png"
    proc = run("replay", GPT2, "--allocator", ROWS, "--capacity", "14GiB", "--report", out,
               check=True)
    assert "torch-native-sim" in proc.stdout  # the table is still printed
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 20000
    assert list(out.parent.iterdir()) == [out]  # no temporary left beside it


def test_report_html_has_the_table_and_the_picture(tmp_path, matplotlib_installed):
    out = tmp_path / "r.html"
    run("replay", GPT2, BERT, "--allocator", ROWS, "--capacity", "14GiB", "--report", out,
        check=True)
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>")
    m = re.search(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m, "no embedded picture"
    png = base64.b64decode(m.group(1))
    assert png[:8] == PNG_MAGIC and len(png) > 20000
    table = page[page.index("<table>"):page.index("</table>")]
    for head in ("peak requested", "peak reserved", "ratio", "verdict"):
        assert f"<th>{head}</th>" in table
    assert table.count("<tr>") == 1 + 8  # the head and every row of the text table
    for name in ROWS.split(","):
        assert f"<td>{name}</td>" in table
    assert "fits with" in table and "runs out of memory at event" in table
    assert "<td class=\"num\">1.0838</td>" in table  # gpt2_train recorded, as in the text table


def test_report_bad_extension_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    for name in ("r.pdf", "r", "r.svg"):
        proc = run("replay", BERT, "--report", tmp_path / "out" / name)
        assert proc.returncode == 2, name
        assert proc.stderr.count("\n") == 1 and ".html" in proc.stderr and ".png" in proc.stderr
        assert proc.stdout == ""  # refused before any replay
    assert list((tmp_path / "out").iterdir()) == []


def test_report_into_a_directory_or_nowhere_is_refused(tmp_path):
    proc = run("replay", BERT, "--report", tmp_path / "missing" / "r.png")
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"cannot write in {tmp_path / 'missing'}: No such file or directory" in proc.stderr


def test_missing_matplotlib_is_one_line_before_any_replay(tmp_path, no_matplotlib):
    out = tmp_path / "r.html"
    proc = run("replay", BERT, "--report", out, "--json", tmp_path / "r.json")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("cuarena: error: --report ")
    assert "'matplotlib'" in proc.stderr and "pip install matplotlib" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert not out.exists() and not (tmp_path / "r.json").exists()


def test_the_script_alone_without_matplotlib(tmp_path, no_matplotlib):
    proc = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("cuarena-report: ") and proc.stderr.count("\n") == 1


def test_a_failed_write_leaves_no_file(tmp_path, matplotlib_installed):
    results = tmp_path / "s.json"
    run("replay", BERT, "--json", results, "--series", check=True)
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    def small_files():  # writes past 4 KB fail with EFBIG instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    for name in ("r.png", "r.html"):
        proc = subprocess.run([sys.executable, SCRIPT, results, out_dir / name],
                              capture_output=True, text=True, preexec_fn=small_files)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"cuarena-report: cannot write {out_dir / name}")
        assert proc.stderr.count("\n") == 1
        assert list(out_dir.iterdir()) == []  # neither the file nor its temporary


def test_script_refuses_what_is_not_results(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"nothing\": 1}")
    proc = subprocess.run([sys.executable, SCRIPT, bad, tmp_path / "r.png"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("cuarena-report: ")
    assert not (tmp_path / "r.png").exists()
