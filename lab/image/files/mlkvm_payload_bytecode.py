"""Compiled code of Ansible's module payloads, kept between module runs on an emulated guest.

Every Ansible module run ships its module and module_utils as a zip (AnsiballZ) that Python
imports with zipimport, which compiles each source file again at every run: it never writes or
reads bytecode. On the lab's software-emulated guests that compile is about a third of a module
run's CPU time (3.0 s -> 2.1 s for ansible.builtin.ping, measured on the tracking VM), paid at
every task of every run. This hook, loaded by a .pth file at interpreter start, keeps the code
object of each payload source in CACHE_DIR, keyed by the interpreter's version, the file's path
inside the payload and its source bytes: a changed source is a new key, never a stale hit.

Only payload zips are affected (a path with "_payload.zip/"); every other import is untouched.
Only root writes the cache, and an entry is used only when the directory and the entry are
root's and writable by no one else: code read from it runs as root, as the modules do.
Lab and test images only (lab/image/build.sh installs it); the collection's roles never do.
"""
import marshal
import os
import sys
import zipimport

CACHE_DIR = "/var/cache/mlkvm-payload-bytecode"
_PAYLOAD_MARK = "_payload.zip/"
_compile_source = zipimport._compile_source  # pylint: disable=protected-access


def _owned_by_root_only(path):
    info = os.stat(path)
    return info.st_uid == 0 and not info.st_mode & 0o022


def _with_filename(code, filename):
    """The code object (and the functions in it) named after this run's payload path."""
    consts = tuple(_with_filename(const, filename) if isinstance(const, type(code)) else const
                   for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _cache_path(pathname, source):
    import hashlib  # here, not at the top: every python3 on the guest loads this file at start
    inner = pathname.split(_PAYLOAD_MARK, 1)[1]
    key = hashlib.sha256(b"\0".join([sys.version.encode(), inner.encode(), source])).hexdigest()
    return os.path.join(CACHE_DIR, key)


def _read(path):
    try:
        if _owned_by_root_only(CACHE_DIR) and _owned_by_root_only(path):
            with open(path, "rb") as handle:
                return marshal.load(handle)
    except (OSError, ValueError, EOFError, TypeError):
        pass
    return None


def _write(path, code):
    if os.geteuid() != 0:
        return
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        if not _owned_by_root_only(CACHE_DIR):
            return
        partial = "%s.%d.partial" % (path, os.getpid())
        with open(partial, "wb") as handle:
            marshal.dump(code, handle)
        os.replace(partial, path)
    except OSError:
        pass


def compile_source(pathname, source):
    """zipimport's compile step, through the cache for payload sources."""
    if _PAYLOAD_MARK not in pathname:
        return _compile_source(pathname, source)
    path = _cache_path(pathname, source)
    code = _read(path)
    if code is not None:
        return _with_filename(code, pathname)
    code = _compile_source(pathname, source)
    _write(path, code)
    return code


zipimport._compile_source = compile_source  # pylint: disable=protected-access
