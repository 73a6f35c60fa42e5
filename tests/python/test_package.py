"""Tests of the Python package `cuarena` (allocator/torch/python/cuarena) that need neither
its C library nor a GPU: the configuration parser and PyTorch-variable rewriting (pure
Python), the packaging metadata, the CLI's help, and that the autoload hook does nothing for
those who did not ask. Tests that need torch skip when it is not installed
(CUARENA_NO_TORCH=1); the library's tests are in test_package_lib.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = REPO / "allocator" / "torch" / "python"
sys.path.insert(0, str(PACKAGE_ROOT))

from cuarena import _conf  # noqa: E402
from cuarena._errors import ConfigError, CuarenaError  # noqa: E402

CUARENA_KEYS = ["per_process_memory_fraction", "small_limit", "stream_cache_bytes", "upstream"]
NEWEST = _conf.NEWEST_MINOR  # the pure tests use one minor's rules, whatever torch is installed
ENV_VARS = ("CUARENA", "CUARENA_CONF", "CUARENA_TRACE", "CUARENA_TORCH_LIB",
            "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def clean_env(**extra):
    """The environment for a subprocess: none of cuarena's variables, the source tree's package
    importable, and torch's entry points off (a pip-installed cuarena would otherwise run its
    hook inside `import torch` before the test's own call)."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT),
                                                      env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def python(code, env, timeout=120):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


def have_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


needs_torch = pytest.mark.skipif(not have_torch(),
                                 reason="torch is not installed (CUARENA_NO_TORCH=1?)")


# --- The splitter ------------------------------------------------------------------------------

def test_split_keys_values_and_positions():
    items = _conf.split("a:1,bb:two")
    assert [(i.key, i.value, i.position) for i in items] == [("a", "1", 0), ("bb", "two", 4)]


def test_split_whitespace_and_empty_items():
    text = "  a : 1 ,, ,\tb:2 ,"
    items = _conf.split(text)
    assert [(i.key, i.value) for i in items] == [("a", "1"), ("b", "2")]
    assert [i.position for i in items] == [2, 13]
    assert text[13] == "b"
    assert items[0].text == "a : 1"  # inner spacing kept for PyTorch's copy
    assert _conf.split("") == [] and _conf.split(" , ,") == []


def test_split_keeps_commas_inside_brackets():
    text = "roundup_power2_divisions:[256:1, 512:2,>:4],x:[a,[b,c]],y:1"
    items = _conf.split(text)
    assert [i.key for i in items] == ["roundup_power2_divisions", "x", "y"]
    assert items[0].value == "[256:1, 512:2,>:4]"
    assert items[1].value == "[a,[b,c]]"
    assert items[2].position == text.index("y:1")


def test_split_value_may_contain_colons():
    [item] = _conf.split("k:a:b")
    assert (item.key, item.value) == ("k", "a:b")


@pytest.mark.parametrize("text, position, what", [
    ("a:1,b:[1,2", 4, "unbalanced '['"),
    ("a:1,b:2]", 7, "unbalanced ']'"),
    ("a:1, novalue ,c:3", 5, "expected key:value"),
])
def test_split_errors_name_the_position(text, position, what):
    with pytest.raises(ConfigError, match=re.escape(what)) as e:
        _conf.split(text, "SOURCE")
    assert str(e.value).startswith("SOURCE: ")
    assert f"position {position}" in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, CuarenaError)


def test_as_dict_ignores_order_and_spacing_and_later_duplicates_win():
    assert _conf.as_dict("a:1, b:2") == _conf.as_dict("b:2,a:1")
    assert _conf.as_dict("a:1,a:3") == {"a": "3"}
    assert _conf.to_string({"a": "1", "b": "[x,y]"}) == "a:1,b:[x,y]"


# --- Whether cuarena is asked for ------------------------------------------------------------

@pytest.mark.parametrize("env, reason", [
    ({}, None),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, None),
    ({"CUARENA": "1"}, "CUARENA=1"),
    ({"CUARENA": ""}, None),
    ({"CUARENA_CONF": "stream_cache_bytes:0"}, "CUARENA_CONF"),
    ({"CUARENA_CONF": "  "}, None),
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena"}, "PYTORCH_CUDA_ALLOC_CONF=...backend:cuarena"),
    ({"PYTORCH_ALLOC_CONF": " backend : cuarena "}, "PYTORCH_ALLOC_CONF=...backend:cuarena"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:native"}, None),
    ({"CUARENA": "0", "PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena", "CUARENA_CONF": "a:1"}, None),
    ({"CUARENA": "maybe"}, "CUARENA=maybe"),  # reported by plan()
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:[cuarena"}, None),  # malformed: PyTorch's to report
    # malformed but asking for cuarena: a request, for plan() to report
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena,small_limit"},
     "PYTORCH_CUDA_ALLOC_CONF=...backend:cuarena"),
])
def test_requested(env, reason):
    assert _conf.requested(env, NEWEST) == (reason, [])


def test_malformed_request_is_reported_not_ignored():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena,small_limit"}
    with pytest.raises(ConfigError, match=r"PYTORCH_CUDA_ALLOC_CONF: expected key:value at "
                                          r"position 16, got 'small_limit'"):
        _conf.plan(env, CUARENA_KEYS, NEWEST)


def test_requested_notes_backend_in_the_variable_pytorch_ignores():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "PYTORCH_ALLOC_CONF": "backend:cuarena"}
    reason, notes = _conf.requested(env, NEWEST)
    assert reason is None
    assert len(notes) == 1
    assert "PYTORCH_ALLOC_CONF" in notes[0] and "PYTORCH_CUDA_ALLOC_CONF" in notes[0]


@pytest.mark.parametrize("minor", range(10, NEWEST + 1))
def test_torch_var_prefers_the_cuda_variable_even_when_empty(minor):
    assert _conf.torch_var({}, minor) is None
    assert _conf.torch_var({"PYTORCH_ALLOC_CONF": "x"}, minor) == "PYTORCH_ALLOC_CONF"
    assert _conf.torch_var({"PYTORCH_ALLOC_CONF": "x", "PYTORCH_CUDA_ALLOC_CONF": ""},
                           minor) == "PYTORCH_CUDA_ALLOC_CONF"


@pytest.mark.parametrize("minor", [8, 9])
def test_torch_before_2_10_reads_only_the_cuda_variable(minor):
    assert _conf.torch_var({"PYTORCH_ALLOC_CONF": "x"}, minor) is None
    reason, notes = _conf.requested({"PYTORCH_ALLOC_CONF": "backend:cuarena"}, minor)
    assert reason is None
    assert notes == [f"cuarena: PYTORCH_ALLOC_CONF asks for backend:cuarena but torch 2.{minor} "
                     "does not read PYTORCH_ALLOC_CONF (use PYTORCH_CUDA_ALLOC_CONF)"]
    p = _conf.plan({"CUARENA": "1", "PYTORCH_ALLOC_CONF": "small_limit:1MiB"}, CUARENA_KEYS,
                   minor)
    assert p.config == "" and "PYTORCH_ALLOC_CONF" not in p.env  # not PyTorch's: left alone


def test_keys_follow_the_torch_minor():
    assert "throw_on_cudamalloc_oom" not in _conf.torch_keys(11)
    assert "throw_on_cudamalloc_oom" in _conf.torch_keys(12)
    assert "expandable_segments_reserve" in _conf.torch_keys(15)
    assert "per_process_memory_fraction" not in _conf.torch_keys(9)
    with pytest.raises(ConfigError, match=r"unknown key 'throw_on_cudamalloc_oom' at position "
                                          r"16;.*torch 2\.11's"):
        _conf.plan({"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena,throw_on_cudamalloc_oom:True"},
                   CUARENA_KEYS, 11)
    p = _conf.plan({"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena,throw_on_cudamalloc_oom:True"},
                   CUARENA_KEYS, 12)
    assert p.env["PYTORCH_CUDA_ALLOC_CONF"] == "throw_on_cudamalloc_oom:True"  # cuarena reads it
    p = _conf.plan({"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena,expandable_segments_reserve:8G"},
                   CUARENA_KEYS, 15)
    assert p.env["PYTORCH_CUDA_ALLOC_CONF"] is None
    assert p.notes == ["cuarena: expandable_segments_reserve has no effect: cuarena reserves its "
                       "own address space (its key va_reserve)"]


def test_a_misspelt_key_gets_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown key 'stream_cahce_bytes' at position 0 "
                                          r"\(did you mean 'stream_cache_bytes'\?\)"):
        _conf.plan({"CUARENA_CONF": "stream_cahce_bytes:0"}, CUARENA_KEYS, NEWEST)


# --- Rewriting PyTorch's variable -------------------------------------------------------------

def plan(**env):
    return _conf.plan(env, CUARENA_KEYS, NEWEST)


def test_plan_splits_the_pytorch_variable_between_cuarena_and_pytorch():
    p = plan(PYTORCH_CUDA_ALLOC_CONF="backend:cuarena,pinned_use_cuda_host_register:True,"
                                     "stream_cache_bytes:0")
    assert p.active
    assert p.config == "stream_cache_bytes:0"
    assert p.env == {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True",
                     "CUARENA": "1", "CUARENA_CONF": "stream_cache_bytes:0"}
    assert p.notes == []


def test_plan_keeps_every_pytorch_host_key_as_written():
    kept = ("pinned_use_cuda_host_register:True, pinned_num_register_threads : 8,"
            "pinned_use_background_threads:True,pinned_reserve_segment_size_mb:64,"
            "pinned_use_hip_host_register:False")
    p = plan(PYTORCH_CUDA_ALLOC_CONF=f"backend:cuarena,{kept},upstream:async")
    assert p.env["PYTORCH_CUDA_ALLOC_CONF"] == kept.replace(", ", ",")
    assert p.config == "upstream:async"


@pytest.mark.parametrize("key, value, why", [
    ("max_split_size_mb", "128", "split limit"),
    ("roundup_power2_divisions", "[256:1,512:2,>:4]", "rounding policy"),
    ("expandable_segments", "True", "segment expansion"),
    ("garbage_collection_threshold", "0.6", "garbage-collection threshold"),
])
def test_plan_drops_native_allocator_keys_with_one_note_each(key, value, why):
    p = plan(PYTORCH_CUDA_ALLOC_CONF=f"backend:cuarena,{key}:{value},"
                                     "pinned_use_cuda_host_register:True")
    assert p.env["PYTORCH_CUDA_ALLOC_CONF"] == "pinned_use_cuda_host_register:True"
    assert p.config == ""
    [note] = p.notes
    assert note.startswith(f"cuarena: {key} has no effect: ")
    assert "out-of-memory" in note and "2 MiB granules" in note and why in note
    assert "\n" not in note


def test_plan_drops_every_native_only_key_and_keeps_no_other():
    native = [k for k in _conf.torch_keys(NEWEST) if k in _conf.NO_EFFECT]
    assert len(native) == 11
    p = plan(PYTORCH_CUDA_ALLOC_CONF=",".join(["backend:cuarena"] + [f"{k}:1" for k in native]))
    assert len(p.notes) == len(native)
    assert p.env["PYTORCH_CUDA_ALLOC_CONF"] is None  # nothing left: deleted


def test_plan_sends_per_process_memory_fraction_to_cuarena():
    p = plan(PYTORCH_CUDA_ALLOC_CONF="backend:cuarena,per_process_memory_fraction:0.5")
    assert p.config == "per_process_memory_fraction:0.5"
    assert p.env["PYTORCH_CUDA_ALLOC_CONF"] is None
    assert p.env["CUARENA_CONF"] == "per_process_memory_fraction:0.5"


def test_plan_empties_rather_than_deletes_when_the_other_variable_is_set():
    # Deleting PYTORCH_CUDA_ALLOC_CONF would make PyTorch read PYTORCH_ALLOC_CONF instead.
    p = plan(PYTORCH_CUDA_ALLOC_CONF="backend:cuarena", PYTORCH_ALLOC_CONF="max_split_size_mb:64")
    assert p.env["PYTORCH_CUDA_ALLOC_CONF"] == ""
    assert "PYTORCH_ALLOC_CONF" not in p.env
    assert any("PYTORCH_ALLOC_CONF is ignored" in n for n in p.notes)


def test_plan_uses_pytorch_alloc_conf_when_the_cuda_variable_is_unset():
    p = plan(PYTORCH_ALLOC_CONF="backend:cuarena,small_limit:1MiB,"
                                "pinned_use_cuda_host_register:True")
    assert p.config == "small_limit:1MiB"
    assert p.env["PYTORCH_ALLOC_CONF"] == "pinned_use_cuda_host_register:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in p.env


def test_plan_leaves_a_variable_with_only_pytorch_keys_alone():
    p = plan(CUARENA="1", PYTORCH_CUDA_ALLOC_CONF="pinned_use_cuda_host_register:True")
    assert p.env == {}  # CUARENA is already "1", no cuarena keys
    assert p.config == ""


def test_cuarena_conf_wins_over_the_pytorch_variable_with_a_note():
    p = plan(PYTORCH_CUDA_ALLOC_CONF="backend:cuarena,stream_cache_bytes:1MiB,upstream:vmm",
             CUARENA_CONF="stream_cache_bytes:0,small_limit:4096")
    assert _conf.as_dict(p.config) == {"stream_cache_bytes": "0", "upstream": "vmm",
                                       "small_limit": "4096"}
    assert p.notes == ["cuarena: stream_cache_bytes: CUARENA_CONF's 0 overrides "
                       "PYTORCH_CUDA_ALLOC_CONF's 1MiB"]
    assert p.env["CUARENA_CONF"] == p.config  # inherited by child processes


def test_plan_unknown_key_names_key_position_variable_and_valid_keys():
    text = "backend:cuarena, pinned_use_cuda_host_register:True,  stream_cahce_bytes:0"
    with pytest.raises(ConfigError) as e:
        plan(PYTORCH_CUDA_ALLOC_CONF=text)
    message = str(e.value)
    assert message.startswith("PYTORCH_CUDA_ALLOC_CONF: unknown key 'stream_cahce_bytes' at "
                              f"position {text.index('stream_cahce')} (did you mean "
                              "'stream_cache_bytes'?);")
    assert "stream_cache_bytes" in message and "pinned_num_register_threads" in message


def test_plan_unknown_key_in_cuarena_conf():
    with pytest.raises(ConfigError, match=r"CUARENA_CONF: unknown key 'max_split_size_mb' at "
                                          r"position 14;.*stream_cache_bytes"):
        plan(CUARENA_CONF="upstream:vmm, max_split_size_mb:2")


@pytest.mark.parametrize("backend", ["native", "cudaMallocAsync"])
def test_plan_other_backend_means_not_cuarena(backend):
    p = plan(PYTORCH_CUDA_ALLOC_CONF=f"backend:{backend},unknown_to_us:1")
    assert not p.active and p.env == {} and p.config == ""


def test_plan_other_backend_conflicts_with_cuarena_variables():
    with pytest.raises(ConfigError, match="backend:native.*CUARENA"):
        plan(CUARENA="1", PYTORCH_CUDA_ALLOC_CONF="backend:native")
    with pytest.raises(ConfigError, match=r"unknown backend 'foo' at position 4"):
        plan(PYTORCH_CUDA_ALLOC_CONF="a:1,backend:foo")
    with pytest.raises(ConfigError, match="CUARENA='maybe'"):
        plan(CUARENA="maybe")


def test_plan_checks_keep_positions_of_the_source():
    text = "backend:cuarena,roundup_power2_divisions:[1:2,>:4], stream_cache_bytes:x,upstream:y"
    p = plan(PYTORCH_CUDA_ALLOC_CONF=text, CUARENA_CONF="small_limit:z")
    (source, masked), conf = p.checks
    assert source == "PYTORCH_CUDA_ALLOC_CONF" and len(masked) == len(text)
    items = _conf.split(masked)
    assert [(i.key, i.value, i.position) for i in items] == [
        ("stream_cache_bytes", "x", text.index("stream")), ("upstream", "y", text.index("upst"))]
    assert conf == ("CUARENA_CONF", "small_limit:z")


# --- PyTorch facts the rewriting relies on (checked against the installed torch) ---------------

def installed_minor():
    import torch
    return _conf.minor_of(torch.__version__)


# PyTorch's allocator-settings call: it parses a string as the environment's is parsed
# (torch 2.9 and later have the generic one; 2.8 only the CUDA allocator's).
PARSE = """
import torch, sys
parse = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or \\
    torch._C._cuda_cudaCachingAllocator_set_allocator_settings
for text in sys.argv[1:]:
    try:
        parse(text)
        print("ok")
    except Exception as e:
        message = str(e).splitlines()[0]
        print("unknown" if "nrecognized" in message or "nknown key" in message else "error:",
              message)
"""

# A value each PyTorch key accepts (or rejects for its value, not its name).
SAMPLE = {"backend": "native", "expandable_segments_reserve": "1G",
          "expandable_segments_reserve_by_class": "[a:1G]", "garbage_collection_threshold": "0.5",
          "max_non_split_rounding_mb": "64", "max_split_size_mb": "100",
          "per_process_memory_fraction": "0.9", "pinned_num_register_threads": "1",
          "pinned_reserve_segment_size_mb": "64", "roundup_power2_divisions": "4"}


def parse_with_torch(*texts):
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", PARSE, *texts],
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@needs_torch
def test_key_table_matches_the_installed_torchs_parser():
    # Every key of TORCH_KEYS_SINCE is accepted by its name exactly from the minor listed.
    minor = installed_minor()
    keys = sorted(_conf.TORCH_KEYS_SINCE) + ["not_a_pytorch_key"]
    texts = [f"{k}:{SAMPLE.get(k, 'False' if 'segment' not in k else '20')}" for k in keys]
    answers = parse_with_torch(*texts)
    accepted = {k for k, a in zip(keys, answers) if not a.startswith("unknown")}
    assert accepted == set(_conf.torch_keys(minor)), f"torch 2.{minor}: {dict(zip(keys, answers))}"


@needs_torch
def test_pytorch_accepts_what_the_rewrite_leaves_and_rejects_what_it_removes():
    minor = installed_minor()
    text = ("backend:cuarena,pinned_use_cuda_host_register:True,expandable_segments:True,"
            "roundup_power2_divisions:[256:1,512:2,>:4],stream_cache_bytes:0,"
            "per_process_memory_fraction:0.5")
    p = _conf.plan({"PYTORCH_CUDA_ALLOC_CONF": text, "PYTORCH_ALLOC_CONF": "x"}, CUARENA_KEYS,
                   minor)
    kept = p.env["PYTORCH_CUDA_ALLOC_CONF"]
    assert kept == "pinned_use_cuda_host_register:True"
    answers = parse_with_torch(kept, text, "backend:cuarena", "stream_cache_bytes:0",
                               "backend:native,max_split_size_mb:64")
    assert answers[0] == "ok" and answers[4] == "ok", answers
    assert answers[1] != "ok" and answers[2] != "ok", answers  # backend:cuarena or our key
    assert answers[3].startswith("unknown"), answers


READ_ENV = """
import torch
parse = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or \\
    torch._C._cuda_cudaCachingAllocator_set_allocator_settings
try:
    parse("")
    print("ok")
except Exception as e:
    print(str(e).splitlines()[0])
"""


@needs_torch
@pytest.mark.parametrize("env", [
    {"PYTORCH_CUDA_ALLOC_CONF": "cuda_var_key:1", "PYTORCH_ALLOC_CONF": "alloc_var_key:1"},
    {"PYTORCH_ALLOC_CONF": "alloc_var_key:1"},
    {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "alloc_var_key:1"},  # set, though empty
])
def test_torch_var_is_the_variable_the_installed_torch_reads(env):
    # With a bad key in each variable, PyTorch's error names the key of the one it reads.
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", READ_ENV],
                          env=clean_env(**env), capture_output=True, text=True, timeout=120)
    line = proc.stdout.strip()
    read = [name for name, value in env.items() if value and value.split(":")[0] in line]
    assert read == [v for v in [_conf.torch_var(env, installed_minor())] if env.get(v)], line


# --- Packaging ----------------------------------------------------------------------------------

def read_pyproject():
    text = (REPO / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return None, text
    return tomllib.loads(text), text


def test_versions_agree():
    import cuarena
    cmake = re.search(r"project\(cuarena VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text())
    data, text = read_pyproject()
    version = data["project"]["version"] if data else \
        re.search(r'^version = "([^"]+)"', text, re.M).group(1)
    assert cuarena.__version__ == version == cmake.group(1)


def test_pyproject_points_at_the_package_and_the_hook():
    data, _ = read_pyproject()
    if data is None:
        pytest.skip("tomllib needs Python 3.11")
    assert data["build-system"]["build-backend"] == "scikit_build_core.build"
    assert not any("torch" in r for r in data["build-system"]["requires"])
    skb = data["tool"]["scikit-build"]
    [package] = skb["wheel"]["packages"]
    assert (REPO / package / "__init__.py").is_file() and package.endswith("/cuarena")
    assert skb["cmake"]["define"]["CUARENA_TORCH_ADAPTER"] == "ON"
    target = data["project"]["entry-points"]["torch.backends"]["cuarena"]
    assert target == "cuarena._autoload:hook"
    from cuarena import _autoload
    assert callable(_autoload.hook)
    assert data["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests/python"]


# --- Light imports and the hook for those who did not ask -------------------------------------

def test_import_cuarena_imports_neither_torch_nor_ctypes():
    proc = python("import sys, cuarena\n"
                  "print(sorted(m for m in ('torch', 'ctypes', 'cuarena._lib') "
                  "if m in sys.modules))", clean_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_hook_does_nothing_when_not_asked():
    code = """
import os, sys
from cuarena import _autoload
env = dict(os.environ)
before = set(sys.modules)
_autoload.hook()
print(sorted(set(sys.modules) - before), env == dict(os.environ))
"""
    for extra in ({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                  {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                  {"CUARENA": "0", "CUARENA_CONF": "x:1"},
                  {"PYTORCH_CUDA_ALLOC_CONF": "backend:[oops"}):
        proc = python(code, clean_env(**extra))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "[] True", (extra, proc.stdout)
        assert proc.stderr == "", (extra, proc.stderr)


# --- The CLI ------------------------------------------------------------------------------------

def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "cuarena", *args], env=env or clean_env(),
                          capture_output=True, text=True, timeout=120)


def test_cli_help():
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    for words in ("python -m cuarena run", "-m module", "info", "CUARENA=1", "CUARENA_CONF",
                  "backend:cuarena", "CUARENA_TRACE", "cuarena replay"):
        assert words in proc.stdout
    assert cli("run", "--help").stdout == proc.stdout


@pytest.mark.parametrize("args, message", [
    ((), "usage: python -m cuarena run"),
    (("frobnicate",), "unknown command 'frobnicate'"),
    (("run",), "usage: python -m cuarena run"),
    (("run", "-m"), "-m needs a module name"),
    (("run", "--config"), "--config needs a value"),
    (("run", "no/such/script.py"), "no such script: no/such/script.py"),
    (("info", "extra"), "info takes no arguments"),
])
def test_cli_usage_errors(args, message):
    proc = cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_a_shim_key_is_named_as_the_shims():
    with pytest.raises(ConfigError, match=r"unknown key 'memory_limit' at position 0 \(a key of "
                                          r"the LD_PRELOAD shim's, not of the PyTorch drop-in's\)"):
        _conf.plan({"CUARENA_CONF": "memory_limit:40GiB"}, CUARENA_KEYS, NEWEST)
