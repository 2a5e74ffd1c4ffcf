"""Minimal PEP 517 build backend for the lazyfork package (standard library only).

It builds a pure-Python wheel of the ``lazyfork`` directory, an sdist, and an editable
wheel (a .pth file pointing at this directory).

With LAZYFORK_WHEEL_BIN set to a directory of executables (``make wheel`` fills it with
statically linked builds of ``lazyfork`` and the stage tools), the wheel is a platform
wheel that also carries them as scripts: ``pip install`` puts them on PATH, the way
Python tools with compiled cores ship their binaries.
"""

import base64
import hashlib
import io
import os
import platform
import stat
import tarfile
import zipfile

NAME = "lazyfork"
VERSION = "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST_INFO = "%s-%s.dist-info" % (NAME, VERSION)
DATA = "%s-%s.data" % (NAME, VERSION)


def _bin_dir():
    d = os.environ.get("LAZYFORK_WHEEL_BIN", "")
    if d and not os.path.isdir(d):
        raise RuntimeError("LAZYFORK_WHEEL_BIN=%s is not a directory: run `make wheel`" % d)
    return d


def _tag():
    # Go binaries run on any Linux of their architecture (static, no libc).
    return "py3-none-linux_%s" % platform.machine() if _bin_dir() else "py3-none-any"


def _binaries():
    d = _bin_dir()
    if not d:
        return
    for fn in sorted(os.listdir(d)):
        path = os.path.join(d, fn)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            yield "%s/scripts/%s" % (DATA, fn), path


def _metadata():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return (
        "Metadata-Version: 2.1\n"
        "Name: %s\nVersion: %s\n"
        "Summary: Client SDK and runtime hook for LazyFork, which forks running Linux containers\n"
        "License: Apache-2.0\nRequires-Python: >=3.8\n"
        "Description-Content-Type: text/markdown\n\n%s" % (NAME, VERSION, readme)
    )


def _wheel_meta():
    pure = "false" if _bin_dir() else "true"
    return "Wheel-Version: 1.0\nGenerator: lazyfork_build\nRoot-Is-Purelib: %s\nTag: %s\n" % (pure, _tag())


def _sources():
    pkg = os.path.join(HERE, NAME)
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py"):
            yield "%s/%s" % (NAME, fn), os.path.join(pkg, fn)


def _write_wheel(directory, files, executables=()):
    name = "%s-%s-%s.whl" % (NAME, VERSION, _tag())
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            if arc in executables:
                info = zipfile.ZipInfo(arc)
                info.external_attr = (stat.S_IFREG | 0o755) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)
            else:
                z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        record.append("%s/RECORD,," % DIST_INFO)
        z.writestr("%s/RECORD" % DIST_INFO, "\n".join(record) + "\n")
    return name


def _dist_info_files():
    return [
        ("%s/METADATA" % DIST_INFO, _metadata().encode()),
        ("%s/WHEEL" % DIST_INFO, _wheel_meta().encode()),
    ]


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, DIST_INFO)
    os.makedirs(d, exist_ok=True)
    for arc, data in _dist_info_files():
        with open(os.path.join(metadata_directory, arc), "wb") as f:
            f.write(data)
    return DIST_INFO


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files, executables = [], set()
    for arc, path in _sources():
        with open(path, "rb") as f:
            files.append((arc, f.read()))
    for arc, path in _binaries():
        with open(path, "rb") as f:
            files.append((arc, f.read()))
        executables.add(arc)
    return _write_wheel(wheel_directory, files + _dist_info_files(), executables)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    pth = ("%s\n" % HERE).encode()
    return _write_wheel(wheel_directory, [("%s.pth" % NAME, pth)] + _dist_info_files())


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, VERSION)
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/lazyfork_build.py"] + [a for a, _ in _sources()]:
            t.add(os.path.join(HERE, rel), arcname="%s/%s" % (base, rel))
        info = tarfile.TarInfo("%s/PKG-INFO" % base)
        data = _metadata().encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return name
