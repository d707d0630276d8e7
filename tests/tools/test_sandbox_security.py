"""Hostile snippets against the bwrap sandbox, through run_python AND `coa-lab exec`.

Every test here that needs isolation is skipped (with the reason) only when bwrap is
absent or cannot run; CI installs bubblewrap so they run there.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from coa_lab.paths import PROJECT_ROOT
from coa_lab.tools import sandbox
from coa_lab.tools.code_tool import CodeTool, exec_main, extract_code
from coa_lab.tools.sandbox import SandboxUnavailableError, run_python

needs_bwrap = pytest.mark.skipif(not sandbox.sandbox_available(),
                                 reason="bubblewrap (bwrap) missing or not working here; apt-get install bubblewrap")


class Result(dict):
    """Uniform view of a run: keys stdout, stderr, exit_code, timed_out, duration."""


def via_api(code: str, timeout: float = 10, memory: int = 1024) -> Result:
    r = run_python(code, timeout_s=timeout, memory_mb=memory)
    assert r.sandboxed
    return Result(stdout=r.stdout, stderr=r.stderr, exit_code=r.exit_code,
                  timed_out=r.timed_out, duration=r.duration_s)


def via_cli(code: str, timeout: float = 10, memory: int = 1024, *, _capsys=None, _tmp=None) -> Result:
    path = _tmp / f"snippet_{uuid.uuid4().hex[:8]}.py"
    path.write_text(code)
    _capsys.readouterr()
    rc = exec_main([str(path), "--timeout", str(timeout), "--memory", str(memory)])
    out = _capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1, out  # exactly ONE JSON object
    data = json.loads(out[0])
    assert set(data) >= {"stdout", "stderr", "exit_code", "timed_out", "duration"}
    return Result(data)


@pytest.fixture(params=["api", "cli"])
def run(request, capsys, tmp_path):
    if request.param == "api":
        return via_api
    return lambda code, timeout=10, memory=1024: via_cli(code, timeout, memory, _capsys=capsys, _tmp=tmp_path)


@needs_bwrap
def test_numpy_sympy_work_inside(run) -> None:
    r = run("import numpy as np, sympy\nprint(int(np.arange(10).sum()), sympy.factor('x**2-1'))")
    assert r["exit_code"] == 0, r["stderr"]
    assert r["stdout"].strip() == "45 (x - 1)*(x + 1)"


@needs_bwrap
def test_cannot_write_outside_tmp(run, tmp_path) -> None:
    name = f"coa_sandbox_escape_{uuid.uuid4().hex}"
    targets = [Path("/root") / name, PROJECT_ROOT / name, tmp_path / name, Path("/usr") / name]
    code = "results = []\n"
    for t in targets:
        code += (f"try:\n    open({str(t)!r}, 'w').write('pwned'); results.append('WROTE')\n"
                 f"except OSError as e:\n    results.append(type(e).__name__)\n")
    code += "open('/tmp/inside.txt', 'w').write('fine'); print(results, open('/tmp/inside.txt').read())"
    r = run(code)
    assert r["exit_code"] == 0, r["stderr"]
    assert "WROTE" not in r["stdout"] and "fine" in r["stdout"]
    for t in targets:
        assert not t.exists(), f"sandbox created host file {t}"


@needs_bwrap
def test_cannot_read_host_files(run, tmp_path) -> None:
    secret = f"TOP-SECRET-{uuid.uuid4().hex}"
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    code = (f"import os\nfor p in [{str(secret_file)!r}, {str(PROJECT_ROOT / 'coa_lab' / 'paths.py')!r},"
            f" '/root/.bashrc', '/etc/shadow', '/etc/passwd']:\n"
            "    try:\n        print(p, open(p).read()[:200])\n"
            "    except OSError as e:\n        print(p, 'BLOCKED', type(e).__name__)\n"
            "print(sorted(os.listdir('/tmp')))")
    r = run(code)
    assert r["exit_code"] == 0, r["stderr"]
    assert secret not in r["stdout"]
    assert r["stdout"].count("BLOCKED") == 5
    assert "main.py" in r["stdout"]  # /tmp is the private tmpfs, holding only our code


@pytest.fixture
def local_server():
    """A TCP server on the HOST's localhost that counts connections."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    hits = {"n": 0}
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                hits["n"] += 1
                conn.close()
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join(1)
    srv.close()


@needs_bwrap
def test_no_network(run, local_server) -> None:
    port, hits = local_server
    code = ("import socket\n"
            f"for addr in [('1.1.1.1', 80), ('127.0.0.1', {port})]:\n"
            "    try:\n        socket.create_connection(addr, timeout=2); print(addr, 'CONNECTED')\n"
            "    except OSError as e:\n        print(addr, 'BLOCKED', e)\n")
    r = run(code)
    assert "CONNECTED" not in r["stdout"] and r["stdout"].count("BLOCKED") == 2, r
    time.sleep(0.3)
    assert hits["n"] == 0


@needs_bwrap
def test_fork_bomb(run) -> None:
    start = time.monotonic()
    r = run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", timeout=3)
    assert time.monotonic() - start < 10
    assert r["timed_out"] or r["exit_code"] != 0
    # The host still forks and the sandbox still works.
    assert subprocess.run(["true"]).returncode == 0
    assert via_api("print('alive')")["stdout"].strip() == "alive"


@needs_bwrap
def test_process_limit_hit(run) -> None:
    code = ("import os, time\nn = 0\ntry:\n    while n < 10000:\n        if os.fork() == 0:\n"
            "            time.sleep(3); os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)")
    r = run(code, timeout=5)
    assert r["exit_code"] == 0, r
    assert int(r["stdout"].strip()) < sandbox.MAX_PROCS


@needs_bwrap
def test_memory_bomb(run) -> None:
    r = run("x = bytearray(4 * 1024**3)\nprint('ALLOCATED')", memory=512)
    assert r["exit_code"] != 0 and "ALLOCATED" not in r["stdout"]
    assert "MemoryError" in r["stderr"] or r["exit_code"] < 0
    r2 = run("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024**2))", memory=512, timeout=10)
    assert r2["exit_code"] != 0 and not r2["timed_out"]


@needs_bwrap
def test_infinite_loop_times_out(run) -> None:
    start = time.monotonic()
    r = run("while True:\n    pass", timeout=2)
    assert r["timed_out"] is True
    assert time.monotonic() - start < 2 + 2


@needs_bwrap
def test_killing_the_parent_spares_the_host(run) -> None:
    sentinel = subprocess.Popen(["sleep", "30"])
    try:
        r = run("import os, signal\n"
                "for fn in (lambda: os.kill(os.getppid(), 9), lambda: os.killpg(os.getpgid(0), 9),\n"
                f"           lambda: os.kill({os.getpid()}, 9), lambda: os.kill({sentinel.pid}, 9),\n"
                "           lambda: os.kill(-1, 9)):\n"
                "    try:\n        fn()\n    except OSError as e:\n        print('denied', e)\n")
        assert r is not None  # we (the host test process) are still alive to see it
        assert sentinel.poll() is None, "a host process was killed from inside the sandbox"
    finally:
        sentinel.kill()
        sentinel.wait()


@needs_bwrap
def test_output_flood_is_capped(run) -> None:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run("import sys\nchunk = 'x' * (1024 * 1024)\nfor _ in range(100):\n    sys.stdout.write(chunk)\n"
            "sys.stdout.flush()\nprint('done', file=sys.stderr)", timeout=20)
    rss_growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert "[output truncated: 104857600 bytes total]" in r["stdout"]
    assert len(r["stdout"]) < 100_000
    assert rss_growth_mb < 60  # the 100 MB never sat in the host's memory


@needs_bwrap
def test_concurrent_runs_do_not_mix() -> None:
    def job(i: int) -> tuple[int, str]:
        return i, run_python(f"import time\ntime.sleep(0.2)\nprint('id={i}')").stdout.strip()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(job, range(8)))
    assert results == [(i, f"id={i}") for i in range(8)]


@needs_bwrap
def test_tmp_is_private_per_run() -> None:
    run_python("open('/tmp/leftover.txt', 'w').write('x')")
    r = run_python("import os\nprint(os.path.exists('/tmp/leftover.txt'))")
    assert r.stdout.strip() == "False"


@needs_bwrap
def test_code_tool_observations() -> None:
    tool = CodeTool(timeout_s=2)
    ok = tool("```python\nprint(6 * 7)\n```")
    assert ok.ok and ok.text == "42"
    err = tool("import sys\nprint('partial')\nsys.exit('bad things')")
    assert not err.ok and err.text.startswith("partial") and "[stderr]" in err.text and "bad things" in err.text
    slow = tool("import time\nprint('start', flush=True)\ntime.sleep(30)")
    assert not slow.ok and "start" in slow.text and "[timed out after 2s]" in slow.text
    quiet = tool("x = 1")
    assert quiet.ok and quiet.text == "(no output)"
    assert not tool("```python\n\n```").ok


def test_extract_code_variants() -> None:
    assert extract_code("```python\nprint(1)\n```") == "print(1)"
    assert extract_code("Let me compute:\n```py\na = 1\n```\nthen\n```\nprint(a)\n```") == "a = 1\n\nprint(a)"
    assert extract_code("print(2)\n") == "print(2)"
    assert extract_code("   ") == ""


def test_missing_bwrap_message(monkeypatch) -> None:
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError,
                       match=r"bubblewrap \(bwrap\) is not installed.*E2B_API_KEY.*allow_unsandboxed=True"):
        run_python("print(1)")
    obs = CodeTool()("print(1)")  # the tool turns it into an observation
    assert not obs.ok and "bubblewrap (bwrap) is not installed" in obs.text
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        r = run_python("print('unsafe but works')", allow_unsandboxed=True, timeout_s=5)
    assert r.stdout.strip() == "unsafe but works" and r.sandboxed is False
    assert exec_main([__file__]) == 2  # CLI: clear message on stderr, non-zero exit


def test_broken_bwrap_is_reported(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: str(fake))
    with pytest.raises(SandboxUnavailableError, match="trial sandbox failed.*namespace") as exc:
        sandbox.check_sandbox()
    assert "E2B_API_KEY" in str(exc.value)  # the ways out where bwrap cannot run here


def test_unsandboxed_timeout_kills_group() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.monotonic()
        r = run_python("import subprocess\nsubprocess.Popen(['sleep', '60'])\nwhile True:\n    pass",
                       timeout_s=1, allow_unsandboxed=True) if shutil.which("sleep") else None
    if r is not None:
        assert r.timed_out and time.monotonic() - start < 4
