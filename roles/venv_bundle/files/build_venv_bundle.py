"""Build a relocatable-by-path virtualenv bundle on the controller, for a guest's CPython.

The controller's pip installs the pinned requirements for the guest's interpreter and platform
(``pip install --target --python-version --platform --only-binary=:all:``) at native speed; the
result is laid out as the venv's own tree (``lib/pythonX.Y/site-packages``, ``bin`` with its
scripts' ``#!`` pointing at the venv's python, and the requirements marker) and written as one
uncompressed tar. On the guest, ``python3 -m venv`` plus one ``tar -x`` makes the venv: no
pip, no compiling, no inflating wheels under software emulation, no index.

    build_venv_bundle.py --dest B.tar --venv /opt/mlinfra/venv --python-version 3.11 \\
        --platform manylinux_2_28_x86_64 ... --marker SHA1 [--pip-arg ARG ...] -- numpy==2.4.6 ...

The tar is written under a temporary name and renamed: an interrupted build leaves no half
bundle that a later run would take as done.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

MARKER_NAME = ".mlinfra-requirements.sha1"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", required=True, type=Path, help="tar file to write")
    parser.add_argument("--venv", required=True, help="absolute path of the venv on the guest")
    parser.add_argument("--python-version", required=True, help="the guest's CPython major.minor")
    parser.add_argument("--platform", action="append", default=[], help="platform tag (repeat)")
    parser.add_argument("--marker", required=True, help="content of the venv's requirements marker")
    parser.add_argument("--pip-arg", action="append", default=[], help="extra pip argument (repeat)")
    parser.add_argument("requirements", nargs="+", help="pinned requirements, name==version")
    args = parser.parse_args(argv)
    if not args.venv.startswith("/"):
        parser.error("--venv %r is not an absolute path" % args.venv)
    if not args.platform:
        parser.error("give at least one --platform")
    return args


def pip_install(target: Path, args: argparse.Namespace) -> None:
    pyver = args.python_version
    argv = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
            "--target", str(target), "--only-binary=:all:", "--python-version", pyver,
            "--implementation", "cp", "--abi", "cp" + pyver.replace(".", "")]
    argv += ["--platform=" + p for p in args.platform]
    # Byte-code is valid only for the same minor version: compile here (native speed) when the
    # controller's interpreter matches the guest's, and never otherwise.
    if "%d.%d" % sys.version_info[:2] != pyver:
        argv.append("--no-compile")
    argv += args.pip_arg + args.requirements
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)


def fix_script(path: Path, python: str) -> None:
    """Point a console script's #! line at the guest venv's interpreter."""
    with path.open("rb") as handle:
        first = handle.readline()
        rest = handle.read()
    if first.startswith(b"#!") and b"python" in first:
        path.write_bytes(b"#!" + python.encode() + b"\n" + rest)


def lay_out(target: Path, tree: Path, args: argparse.Namespace) -> None:
    site = tree / "lib" / ("python" + args.python_version) / "site-packages"
    site.parent.mkdir(parents=True)
    scripts = target / "bin"
    bindir = tree / "bin"
    bindir.mkdir()
    if scripts.is_dir():
        for script in sorted(scripts.iterdir()):
            if script.is_file():
                fix_script(script, args.venv.rstrip("/") + "/bin/python")
                shutil.move(str(script), str(bindir / script.name))
        scripts.rmdir()
    target.rename(site)
    (tree / MARKER_NAME).write_text(args.marker + "\n")


def root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".venv-bundle-", dir=str(args.dest.parent)) as tmp:
        target = Path(tmp) / "target"
        tree = Path(tmp) / "tree"
        tree.mkdir()
        pip_install(target, args)
        lay_out(target, tree, args)
        part = Path(tmp) / "bundle.tar"
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
            # The marker goes in last: a guest whose extraction was cut short has no marker and
            # installs again on the next run.
            for entry in sorted(tree.iterdir(), key=lambda e: (e.name == MARKER_NAME, e.name)):
                tar.add(str(entry), arcname=entry.name, filter=root_owned)
        os.chmod(part, 0o644)
        part.rename(args.dest)
    print("bundle: %s (%d MiB)" % (args.dest, args.dest.stat().st_size // (1 << 20)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
