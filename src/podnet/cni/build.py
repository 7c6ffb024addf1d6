"""Build and install the podnet CNI plugin executable (``<bin_dir>/podnet``).

The C shim (``podnet-cni.c``) is preferred: it starts in about 1 ms. A compiled shim is
kept in ``/var/cache/podnet/cni-shim/`` under the SHA-256 of its source, flags and
compiler, so a host compiles it once, not at every new agent state (a cache that is not
root's alone, 0700, is not used). Without gcc the
plugin is a Python launcher that runs ``shim.py`` under the real interpreter with
``-I -S``; its shebang names that interpreter directly, never ``/usr/bin/env``, because a
wrapper such as pyenv's costs 100 ms per CNI call.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

from podnet.files import write_atomic

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
C_SOURCE = SOURCE_DIR / "podnet-cni.c"
PY_SOURCES = ("shim.py", "validate.py")
PLUGIN_NAME = "podnet"
# The Python shim's modules, next to the launcher (runtimes only execute <type> names).
LIB_DIR_NAME = ".podnet-shim"
CC_FLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra", "-s")
BUILD_TIMEOUT = 120.0
SHIM_CACHE = Path("/var/cache/podnet/cni-shim")
# Linux reads at most this many bytes of a "#!" line (BINPRM_BUF_SIZE).
SHEBANG_MAX = 255


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _compile(cc: str, out: Path) -> bool:
    cmd = [cc, *CC_FLAGS, "-o", str(out), str(C_SOURCE)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("building the C CNI shim failed: %s", exc)
        return False
    if proc.returncode != 0:
        log.warning("building the C CNI shim failed: %s", proc.stderr.strip())
        return False
    return True


def _cache_key(cc: str) -> str:
    real = os.path.realpath(cc)
    info = os.stat(real)
    digest = hashlib.sha256(C_SOURCE.read_bytes())
    digest.update(repr((CC_FLAGS, real, info.st_size, info.st_mtime_ns)).encode())
    return digest.hexdigest()


def _private(path: Path, kind: int) -> bool:
    """``path`` is a ``kind`` (S_IFDIR/S_IFREG) of this user's that nobody else may write."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return (
        stat.S_IFMT(info.st_mode) == kind
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _cached(cache: Path, key: str) -> Path | None:
    found = cache / key
    if _private(cache, stat.S_IFDIR) and _private(found, stat.S_IFREG):
        return found
    return None


def _keep(cache: Path, key: str, built: Path) -> None:
    """Best effort: a failure to cache only means compiling again next time."""
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(cache, stat.S_IFDIR):
            return
        tmp = _temp_name(cache / key)
        shutil.copyfile(built, tmp)
        tmp.chmod(0o755)
        os.replace(tmp, cache / key)
    except OSError as exc:
        log.info("not caching the C CNI shim in %s: %s", cache, exc)


def build_c_shim(out_path: Path, compiler: str = "gcc", cache: Path | None = SHIM_CACHE) -> bool:
    """Compile the C shim to ``out_path`` (or take it from ``cache``); return False if gcc
    is missing or fails.

    The binary replaces ``out_path`` atomically, so a runtime executing the old one is
    never disturbed (writing in place would fail with ETXTBSY).
    """
    cc = shutil.which(compiler)
    if cc is None:
        log.info("no %s: the CNI plugin will be the Python shim", compiler)
        return False
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(out_path)
    key = _cache_key(cc)
    try:
        cached = _cached(cache, key) if cache is not None else None
        if cached is not None:
            shutil.copyfile(cached, tmp)
        elif not _compile(cc, tmp):
            return False
        elif cache is not None:
            _keep(cache, key, tmp)
        tmp.chmod(0o755)
        os.replace(tmp, out_path)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _real_interpreter(python: str) -> str:
    real = os.path.realpath(python)
    with open(real, "rb") as f:
        if f.read(2) == b"#!":
            raise ValueError(f"{python} is a script, not an interpreter binary")
    return real


def launcher_text(python: str, lib_dir: Path) -> str:
    """The Python launcher script: runs the shim copied into ``lib_dir`` with -I -S.

    The flags are written ``-IS``: Linux passes everything after the interpreter in a
    "#!" line as one argument, and Python rejects "-I -S" as a single argument.
    """
    shebang = f"#!{python} -IS"
    if not os.path.isabs(python) or any(ch.isspace() for ch in python):
        raise ValueError(f"interpreter path unusable in a #! line: {python!r}")
    if len(shebang) > SHEBANG_MAX:
        raise ValueError(f"interpreter path too long for a #! line: {python!r}")
    return (
        f"{shebang}\n"
        "# podnet CNI plugin (Python shim), written by podnet.cni.build.install_shim.\n"
        "import sys\n"
        f"sys.path.insert(0, {str(lib_dir)!r})\n"
        "from shim import main\n"
        "sys.exit(main())\n"
    )


def _precompile(python: str, lib_dir: Path) -> None:
    # Byte-compile with the interpreter that will run them, so no run pays for it.
    files = [str(lib_dir / name) for name in PY_SOURCES]
    try:
        subprocess.run([python, "-I", "-S", "-m", "py_compile", *files], timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not byte-compile the Python CNI shim: %s", exc)


def install_python_shim(bin_dir: Path, python: str) -> Path:
    """Install the Python launcher as ``<bin_dir>/podnet``; return its path."""
    interpreter = _real_interpreter(python)
    lib_dir = bin_dir / LIB_DIR_NAME
    lib_dir.mkdir(parents=True, exist_ok=True)
    for name in PY_SOURCES:
        write_atomic(lib_dir / name, (SOURCE_DIR / name).read_bytes(), 0o644)
    _precompile(interpreter, lib_dir)
    target = bin_dir / PLUGIN_NAME
    write_atomic(target, launcher_text(interpreter, lib_dir).encode(), 0o755)
    return target


def install_shim(bin_dir: Path, python: str, prefer_c: bool = True) -> Path:
    """Install the CNI plugin as ``<bin_dir>/podnet``: the C shim if it builds, else the
    Python launcher running under ``python``. Returns the installed path."""
    target = bin_dir / PLUGIN_NAME
    if prefer_c and build_c_shim(target):
        return target
    return install_python_shim(bin_dir, python)
