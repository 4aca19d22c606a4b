"""The lab image's bytecode cache for Ansible's module payloads (lab/image/files/mlkvm_payload_bytecode.py).

Each case runs a fresh interpreter that loads the hook the way the image's .pth file does, with
its cache in tmp_path, and imports a module from a zip named like an AnsiballZ payload, from a
new directory each time (Ansible unpacks every run's payload into a fresh temporary directory).
"""
from __future__ import annotations

import marshal
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.unit
HOOK_DIR = ROOT / "lab" / "image" / "files"
SOURCE = "VALUE = %d\n\ndef where():\n    return where.__code__.co_filename\n"

RUN = """
import sys
sys.path.insert(0, %(hook_dir)r)
import mlkvm_payload_bytecode as hook
hook.CACHE_DIR = %(cache)r
sys.path.insert(0, %(zip)r)
import payload_mod
print(payload_mod.VALUE, payload_mod.where())
"""


def run_payload(tmp_path: Path, run: str, value: int, zip_name: str = "ansible_ping_payload.zip") -> tuple:
    """Import payload_mod (VALUE = value) from a zip in a new directory; (VALUE, co_filename)."""
    where = tmp_path / run
    where.mkdir()
    archive = where / zip_name
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("payload_mod.py", SOURCE % value)
    script = RUN % {"hook_dir": str(HOOK_DIR), "cache": str(tmp_path / "cache"), "zip": str(archive)}
    proc = subprocess.run([sys.executable, "-B", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    found, filename = proc.stdout.split()
    return int(found), filename


def entries(tmp_path: Path) -> list:
    cache = tmp_path / "cache"
    return sorted(cache.iterdir()) if cache.exists() else []


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root writes the cache (the modules run as root)")


@needs_root
def test_a_payload_source_is_compiled_once_and_read_back_by_the_next_run(tmp_path):
    assert run_payload(tmp_path, "run1", 1)[0] == 1
    [entry] = entries(tmp_path)
    assert oct((tmp_path / "cache").stat().st_mode & 0o777) == "0o700"
    # Proof that the next run reads the entry instead of compiling: an entry that says 7.
    entry.write_bytes(marshal.dumps(compile(SOURCE % 7, "x", "exec")))
    value, filename = run_payload(tmp_path, "run2", 1)
    assert value == 7
    # Names in tracebacks are this run's payload path, not the run that compiled it.
    assert filename == str(tmp_path / "run2" / "ansible_ping_payload.zip" / "payload_mod.py")


@needs_root
def test_a_changed_source_is_a_new_entry_never_a_stale_hit(tmp_path):
    assert run_payload(tmp_path, "run1", 1)[0] == 1
    assert run_payload(tmp_path, "run2", 2)[0] == 2
    assert len(entries(tmp_path)) == 2


@needs_root
def test_an_entry_others_may_write_is_ignored(tmp_path):
    run_payload(tmp_path, "run1", 1)
    [entry] = entries(tmp_path)
    entry.write_bytes(marshal.dumps(compile(SOURCE % 7, "x", "exec")))
    entry.chmod(0o666)
    assert run_payload(tmp_path, "run2", 1)[0] == 1


@needs_root
def test_imports_other_than_payloads_are_left_alone(tmp_path):
    assert run_payload(tmp_path, "run1", 3, zip_name="library.zip")[0] == 3
    assert entries(tmp_path) == []


def test_the_image_installs_the_hook_where_every_python3_loads_it():
    build = (ROOT / "lab" / "image" / "build.sh").read_text(encoding="utf-8")
    pth = (HOOK_DIR / "mlkvm-payload-bytecode.pth").read_text(encoding="utf-8")
    assert pth.strip() == "import mlkvm_payload_bytecode"
    for name in ("mlkvm_payload_bytecode.py", "mlkvm-payload-bytecode.pth"):
        assert '"$ROOTFS/usr/lib/python3/dist-packages/%s"' % name in build
