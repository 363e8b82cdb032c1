"""The PEP 517 build backend of the memledger Python package (in-tree,
pyproject.toml's backend-path): builds libmemledger.so and the memledger
command line with meson and ninja in a temporary directory (the checkout is
only read: a read-only or shared one is left as it was) and writes a wheel
holding the ctypes binding (python/memledger/), that library and that
command line.

Why its own backend: the project installs offline. Debian ships the build
tools (meson, ninja, a C compiler) but a backend from PyPI (setuptools,
meson-python) is out of reach of pip's isolated build environment, so a
backend that needs nothing but the standard library makes plain
`pip install .` work, with or without --no-build-isolation, on any Python
with pip. A wheel is a zip with a dist-info folder (PEP 427); that is all
this writes. No sdist, no editable install.
"""
import base64
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "memledger"
SUMMARY = "Plan GPU training memory and FLOPs before launching a job (ctypes binding)"


def _version():
    with open(os.path.join(ROOT, "meson.build"), encoding="utf-8") as f:
        m = re.search(r"version\s*:\s*'([^']+)'", f.read())
    return m.group(1)


def _tag():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-" + plat


def _dist_info():
    return "%s-%s.dist-info" % (NAME, _version())


def _metadata():
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\n"
            "License: MIT\nRequires-Python: >=3.8\n" % (NAME, _version(), SUMMARY))


def _wheel_file():
    return ("Wheel-Version: 1.0\nGenerator: memledger_build\nRoot-Is-Purelib: false\n"
            "Tag: %s\n" % _tag())


def _tool_env():
    """The environment for meson: without pip's PYTHONPATH, whose isolated
    build environment would hide Debian's mesonbuild module from
    /usr/bin/meson (a Python program too)."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")}


def _build(tmp):
    """libmemledger.so.N and the memledger executable, built from the checkout
    in tmp (a temporary directory the caller removes): the checkout is only
    read, so a read-only or shared one stays as it was. The library and the
    command line alone, no tests. Returns their paths."""
    build = os.path.join(tmp, "build")
    subprocess.run(["meson", "setup", build, ROOT, "--buildtype=release", "-Dtests=false",
                    "-Dcuda=disabled", "-Dblas=disabled", "-Dtorch_crosscheck=disabled",
                    "-Drender_tests=disabled"], cwd=tmp, check=True, stdout=sys.stderr,
                   env=_tool_env())
    lib = "src/libmemledger.so." + _version()
    exe = "src/memledger"
    subprocess.run(["ninja", "-C", build, lib, exe], cwd=tmp, check=True, stdout=sys.stderr,
                   env=_tool_env())
    return os.path.join(build, lib), os.path.join(build, exe)


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "%s,sha256=%s,%d" % (arcname, digest.decode(), len(data))


def _files():
    """(name in the wheel, bytes) of the package, the library and the
    command line (the verbs the binding runs as `memledger VERB --format
    json`, python/memledger/_cli.py)."""
    pkg = os.path.join(ROOT, "python", NAME)
    out = []
    for f in sorted(os.listdir(pkg)):
        if f.endswith(".py"):
            with open(os.path.join(pkg, f), "rb") as fh:
                out.append((NAME + "/" + f, fh.read()))
    tmp = tempfile.mkdtemp(prefix="memledger-build-")
    try:
        lib, exe = _build(tmp)
        with open(lib, "rb") as fh:
            # the soname: what ctypes loads from the package (python/memledger/_native.py)
            out.append((NAME + "/_lib/libmemledger.so.0", fh.read()))
        with open(exe, "rb") as fh:
            out.append((NAME + "/_lib/memledger", fh.read()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    for name, text in (("METADATA", _metadata()), ("WHEEL", _wheel_file())):
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)
    return _dist_info()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = _files()
    di = _dist_info()
    files.append((di + "/METADATA", _metadata().encode()))
    files.append((di + "/WHEEL", _wheel_file().encode()))
    record = [_record_line(n, d) for n, d in files] + [di + "/RECORD,,"]
    files.append((di + "/RECORD", ("\n".join(record) + "\n").encode()))
    name = "%s-%s-%s.whl" % (NAME, _version(), _tag())
    tmp = os.path.join(wheel_directory, name + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            executable = arcname.endswith((".so.0", "/memledger"))
            # a regular file's mode: pip keeps the executable bit only with S_IFREG
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    shutil.move(tmp, os.path.join(wheel_directory, name))
    return name
