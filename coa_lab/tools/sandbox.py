"""Run model-written Python in a bubblewrap (bwrap) sandbox; the "code" tool.

Model-written code is hostile by default: during RL the policy explores, and a reward
hack that deletes files or opens sockets will eventually be tried.  ``run_python``
therefore runs each snippet in a fresh bwrap container:

* namespaces: new pid, net (no network at all, not even the host's localhost), ipc,
  uts, mount (and user when not root) -- the snippet sees only its own processes;
* filesystem: read-only binds of /usr (+ /lib, /bin symlinks), a few /etc files and the
  running interpreter's prefixes (so numpy/sympy import); a private tmpfs ``/tmp`` is
  the only writable place and the cwd; nothing from $HOME or the project is visible;
* an unprivileged uid inside; when the host runs as root the snippet gets a fresh
  non-zero *host* uid, because the kernel does not apply RLIMIT_NPROC to uid 0;
* rlimits set by an in-sandbox bootstrap: address space, CPU seconds, process count
  (fork bombs), file size, open files, no core dumps;
* a wall-clock timeout that SIGKILLs bwrap's process group; ``--die-with-parent`` and
  the pid namespace then take every process of the snippet down with it;
* stdout/stderr read incrementally with a byte cap (a 100 MB print never sits in RAM).

The code goes in over stdin and is written by the bootstrap to the private /tmp, so no
host path ever holds it.  Backends: local bwrap (default) and ``E2BCodeTool`` (remote,
when ``E2B_API_KEY`` is set), both in ``code_tool.py`` together with ``exec_main`` (the
``coa-lab exec`` CLI).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_OUTPUT_CHARS = 20_000
MAX_PROCS = 64            # processes+threads per snippet; a fork bomb hits this wall
MAX_FILE_MB = 64          # largest file a snippet may write (tmpfs also capped below)
TMPFS_MB = 256
_SANDBOX_TMP = "/tmp"
# Host uids handed to root-launched sandboxes; one per run so that concurrent snippets
# do not share an RLIMIT_NPROC budget (a fork bomb in one cannot starve another).
_UID_BASE, _UID_SPAN = 200_000, 50_000
_uid_counter = 0
_uid_lock = threading.Lock()

# Where bwrap cannot run (macOS, a container without user namespaces, some notebooks hosts), the
# ways out, named in every such error: E2B's remote sandbox, or an explicit unsafe opt-in.
WAYS_OUT = ("Or run model-written code in E2B's remote sandbox: set E2B_API_KEY (the `code` tool then "
            "uses it; pip install e2b-code-interpreter). Or, on a machine you own, CodeTool(allow_unsandboxed=True) "
            "runs it without isolation (unsafe).")
BWRAP_MISSING = (
    "bubblewrap (bwrap) is not installed; run `make setup` / `apt-get install bubblewrap`. " + WAYS_OUT
)

# Runs inside the sandbox as `python -I -B -c BOOTSTRAP CONFIG_JSON`, code on stdin.
# It must stay tiny and stdlib-only: every millisecond here is paid per tool call.
_BOOTSTRAP = r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
code = sys.stdin.buffer.read()
null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0); os.close(null)
for name, (soft, hard) in cfg["limits"].items():
    resource.setrlimit(getattr(resource, name), (soft, hard))
wd = cfg["workdir"]
main = os.path.join(wd, "main.py")
with open(main, "wb") as f:
    f.write(code)
uid = cfg["uid"]
if uid is not None:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
    try:  # a uid change makes us non-dumpable, which hides /proc/self from ourselves
        import ctypes; ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)
    except Exception:
        pass
os.chdir(wd)
sys.argv = [main]; sys.path.insert(0, wd)
sys.stdout.reconfigure(errors="backslashreplace"); sys.stderr.reconfigure(errors="backslashreplace")
del cfg, code, f, null, uid, name, soft, hard
import runpy
try:
    runpy.run_path(main, run_name="__main__")
except SystemExit:
    raise
except BaseException as e:
    import traceback
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != main:
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)
    sys.exit(1)
"""


class SandboxUnavailableError(RuntimeError):
    """bwrap is missing or cannot create its namespaces on this machine."""


@dataclass
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    duration_s: float
    sandboxed: bool
    output_truncated: bool = False


# --------------------------------------------------------------------------- bwrap


def _interpreter_roots() -> list[str]:
    """Directories the interpreter needs: venv prefix and base installation prefix."""
    roots: list[str] = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        for candidate in (p, os.path.realpath(p)):
            if candidate and candidate not in roots and os.path.isdir(candidate):
                roots.append(candidate)
    # /usr is bound anyway; binding it twice would only slow the setup down.
    return [r for r in roots if r != "/usr" and not r.startswith("/usr/")]


def _next_uid() -> int:
    global _uid_counter
    with _uid_lock:
        _uid_counter = (_uid_counter + 1) % _UID_SPAN
        return _UID_BASE + _uid_counter


@functools.lru_cache(maxsize=None)
def _bwrap_has_option(bwrap: str, option: str) -> bool:
    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return option in (help_text.stdout + help_text.stderr)


def _bwrap_args(bwrap: str) -> list[str]:
    args = [bwrap]
    if os.geteuid() == 0:
        # As root, no user namespace: the bootstrap drops to a fresh non-zero host uid
        # (RLIMIT_NPROC is ignored for uid 0).  Only setuid/setgid survive, for that drop.
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                 "--unshare-cgroup-try", "--cap-drop", "ALL",
                 "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-all", "--uid", "65534", "--gid", "65534"]
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox",
             "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # A minimal /etc: the dynamic loader's cache and timezone; no passwd/shadow/ssl/hosts.
    # (--perms: bwrap would otherwise create /etc 0700, unreadable after the uid drop.)
    args += ["--perms", "0755", "--dir", "/etc"]
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
                "/etc/alternatives", "/etc/localtime"):
        args += ["--ro-bind-try", etc, etc]
    args += ["--proc", "/proc", "--dev", "/dev"]
    if _bwrap_has_option(bwrap, "--size"):  # bwrap >= 0.7; without it tmpfs is RAM-bounded only
        args += ["--size", str(TMPFS_MB * 1024 * 1024)]
    args += ["--perms", "1777", "--tmpfs", _SANDBOX_TMP]
    # Prefix binds come after the tmpfs so a venv living under /tmp is still visible.
    made = {"/", _SANDBOX_TMP}
    for root in _interpreter_roots():
        # bwrap would create missing parents with the host's modes (/root is 0700), which
        # would lock the dropped uid out of the interpreter; create them world-readable.
        for parent in reversed(Path(root).parents):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", root, root]
    args += ["--chdir", _SANDBOX_TMP, "--clearenv"]
    for key, value in _sandbox_env(_SANDBOX_TMP).items():
        args += ["--setenv", key, value]
    return args


def _sandbox_env(home: str) -> dict[str, str]:
    # One BLAS/OpenMP thread: threads count against RLIMIT_NPROC and each reserves
    # address space against RLIMIT_AS; a teaching snippet never needs 16 of them.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home,
            "LANG": "C.UTF-8", "USER": "sandbox", "LOGNAME": "sandbox",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "MPLCONFIGDIR": home, "MPLBACKEND": "Agg"}


_probe_cache: dict[tuple[str, str, int], str | None] = {}
_probe_lock = threading.Lock()


def check_sandbox() -> str:
    """Return the bwrap path if a trial sandbox runs here; else raise SandboxUnavailableError.

    The probe (one tiny sandboxed python) runs once per process and is cached.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError(BWRAP_MISSING)
    key = (bwrap, sys.executable, os.geteuid())
    with _probe_lock:
        if key not in _probe_cache:
            # The probe takes the real path (bootstrap, uid drop, rlimits), so that e.g. an
            # interpreter unreadable by the dropped uid is caught here, with its message.
            cmd = _sandboxed_cmd(bwrap, timeout_s=30, memory_mb=1024)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                                      input="print('sandbox-ok')")
                ok = proc.returncode == 0 and "sandbox-ok" in proc.stdout
                detail = (proc.stderr or proc.stdout).strip()[-800:]
            except (OSError, subprocess.TimeoutExpired) as exc:
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            _probe_cache[key] = None if ok else (
                f"bubblewrap is installed at {bwrap} but a trial sandbox failed: {detail!r}. "
                "Typical causes: user namespaces are disabled (sysctl "
                "kernel.unprivileged_userns_clone=1 / kernel.apparmor_restrict_unprivileged_userns=0), "
                "a container without CAP_SYS_ADMIN, or (as root) interpreter files not "
                "world-readable for the sandbox's unprivileged uid. " + WAYS_OUT
            )
        failure = _probe_cache[key]
    if failure is not None:
        raise SandboxUnavailableError(failure)
    return bwrap


def sandbox_available() -> bool:
    try:
        check_sandbox()
        return True
    except SandboxUnavailableError:
        return False


# ------------------------------------------------------------------------ running


class _CappedReader(threading.Thread):
    """Drain a pipe to EOF, keeping only the first ``cap`` bytes (bounded memory)."""

    def __init__(self, stream, cap: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.buf = bytearray()
        self.total = 0

    def run(self) -> None:
        fd = self.stream.fileno()
        try:
            while chunk := os.read(fd, 1 << 16):
                self.total += len(chunk)
                room = self.cap - len(self.buf)
                if room > 0:
                    self.buf += chunk[:room]
        except OSError:
            pass

    def text(self, max_chars: int) -> tuple[str, bool]:
        s = self.buf.decode("utf-8", errors="replace")
        cut = self.total > len(self.buf) or len(s) > max_chars
        if cut:
            s = s[:max_chars] + f"\n...[output truncated: {self.total} bytes total]"
        return s, cut


def _limits(timeout_s: float, memory_mb: int, nproc: bool) -> dict[str, tuple[int, int]]:
    cpu = int(timeout_s) + 1
    limits = {
        "RLIMIT_AS": (memory_mb * 1024 * 1024,) * 2,
        "RLIMIT_CPU": (cpu, cpu + 1),  # soft -> SIGXCPU, hard -> SIGKILL
        "RLIMIT_FSIZE": (MAX_FILE_MB * 1024 * 1024,) * 2,
        "RLIMIT_NOFILE": (256, 256),
        "RLIMIT_CORE": (0, 0),
    }
    if nproc:
        limits["RLIMIT_NPROC"] = (MAX_PROCS, MAX_PROCS)
    return limits


def _sandboxed_cmd(bwrap: str, timeout_s: float, memory_mb: int) -> list[str]:
    uid = _next_uid() if os.geteuid() == 0 else None
    config = {"workdir": _SANDBOX_TMP, "uid": uid, "limits": _limits(timeout_s, memory_mb, nproc=True)}
    return _bwrap_args(bwrap) + ["--", sys.executable, "-I", "-B", "-c", _BOOTSTRAP, json.dumps(config)]


def run_python(
    code: str,
    timeout_s: float = 10,
    memory_mb: int = 1024,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    allow_unsandboxed: bool = False,
) -> ExecResult:
    """Run ``code`` with ``sys.executable`` in a fresh sandbox and capture its output.

    Raises ``SandboxUnavailableError`` when bwrap is missing/broken and
    ``allow_unsandboxed`` is False; with it True such machines run the code with
    rlimits and a timeout only, after a ``warnings.warn``.
    """
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError("timeout_s and memory_mb must be positive")
    try:
        bwrap: str | None = check_sandbox()
    except SandboxUnavailableError as exc:
        if not allow_unsandboxed:
            raise
        warnings.warn(f"running code WITHOUT a sandbox (unsafe): {exc}", RuntimeWarning, stacklevel=2)
        bwrap = None

    tmp_ctx = tempfile.TemporaryDirectory(prefix="coa-exec-") if bwrap is None else None
    try:
        if bwrap is not None:
            cmd, env = _sandboxed_cmd(bwrap, timeout_s, memory_mb), None
        else:
            assert tmp_ctx is not None
            # Without namespaces RLIMIT_NPROC would count all of the user's processes.
            config = {"workdir": tmp_ctx.name, "uid": None,
                      "limits": _limits(timeout_s, memory_mb, nproc=False)}
            cmd = [sys.executable, "-I", "-B", "-c", _BOOTSTRAP, json.dumps(config)]
            env = _sandbox_env(tmp_ctx.name)
        return _execute(cmd, env, code, timeout_s, max_output_chars, sandboxed=bwrap is not None)
    finally:
        if tmp_ctx is not None:
            tmp_ctx.cleanup()


def _execute(cmd: list[str], env: dict[str, str] | None, code: str, timeout_s: float,
             max_output_chars: int, sandboxed: bool) -> ExecResult:
    start = time.monotonic()
    # start_new_session: bwrap leads its own process group, so one killpg reaches it all.
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    cap = max(4 * max_output_chars, 4096)
    readers = [_CappedReader(proc.stdout, cap), _CappedReader(proc.stderr, cap)]
    for r in readers:
        r.start()

    def feed() -> None:
        try:
            proc.stdin.write(code.encode("utf-8", errors="surrogateescape"))
            proc.stdin.close()
        except OSError:  # sandbox died before reading; its stderr says why
            pass

    threading.Thread(target=feed, daemon=True).start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        # Always kill the group: also reaps unsandboxed grandchildren that outlive main.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    for r in readers:
        r.join(timeout=2.0)
    duration = time.monotonic() - start
    stdout, cut_out = readers[0].text(max_output_chars)
    stderr, cut_err = readers[1].text(max_output_chars)
    return ExecResult(stdout=stdout, stderr=stderr, exit_code=proc.returncode,
                      timed_out=timed_out, duration_s=duration, sandboxed=sandboxed,
                      output_truncated=cut_out or cut_err)

