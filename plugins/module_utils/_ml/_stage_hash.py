# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Content hashing for ml_stage: the algorithm, a per-file stat cache and tree walks.

Runs on the target host with whatever Python it has: ``xxhash`` and ``blake3`` are used
when importable, ``hashlib`` (sha256, SHA-NI through OpenSSL) always works.

Algorithm choice (``auto``), measured by ``bench/stage`` on the lab host (1 GiB file in
the page cache, 1 MiB ``readinto`` buffer, one thread, ranges over loads of the shared
host): xxh3_128 3.1-6.7 GB/s, blake3 1.7-3.3 GB/s, sha256 (SHA-NI) 0.45-1.1 GB/s, md5 (what
DVC uses) 0.2-0.55 GB/s. All are sound for
change detection (128 bits or more, no accidental collisions in practice); xxh3_128 is
not collision resistant against someone *crafting* files, so set
``hash_algorithm: blake3`` where that matters. ``auto`` keeps the algorithm the lock was
written with while it is importable, so installing or removing a package never forces a
re-run by itself.

Stat cache: a file whose (size, mtime_ns, ctime_ns, inode, device) is unchanged since it
was hashed is not read again. ctime cannot be set from user space, so an edit whose mtime
was restored (``touch -r``, ``os.utime``) still changes the signature. Files changed less
than :data:`RACY_NS` before they were looked at are never cached (a write in the same
timestamp tick could otherwise go unseen). On top of that, each walked tree keeps one
signature over all its files' stat tuples: when it matches, the tree's hash is reused
without loading the per-file cache at all, which is what makes a no-op check fast.
"""
from __future__ import annotations

import hashlib
import marshal
import operator
import os
import re
import stat as _stat
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .._core._atomic_file import write_bytes_atomic

try:
    import xxhash  # type: ignore
    HAS_XXHASH = True
except ImportError:
    xxhash = None  # type: ignore
    HAS_XXHASH = False

try:
    import blake3 as _blake3  # type: ignore
    HAS_BLAKE3 = True
except ImportError:
    _blake3 = None  # type: ignore
    HAS_BLAKE3 = False

# Fastest first, as measured by bench/stage (see the module docstring).
PREFERENCE = ("xxh3_128", "blake3", "sha256")
SUPPORTED = ("xxh3_128", "blake3", "sha256", "md5")
# Safe against someone crafting a second file with the same hash (what mlflow.reuse needs).
COLLISION_RESISTANT = ("blake3", "sha256")

CHUNK = 1 << 20            # read buffer for big files
SMALL = 1 << 20            # files up to this size are read in one call
RACY_NS = 2 * 10 ** 9      # files changed this recently are hashed but not cached
CACHE_FORMAT = 2
_WORKERS = max(4, min(32, (os.cpu_count() or 1) * 4))


class SpecialFileError(OSError):
    """A FIFO, device or socket where content was to be hashed. Reading one would block
    (a FIFO without a writer), never end (/dev/zero) or make no sense (a socket), all while
    the stage's lock is held, so it is refused instead, after an lstat/stat, never an open."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__("%s is a %s, not a regular file" % (path, kind))
        self.path = path
        self.kind = kind


def special_kind(mode: int) -> Optional[str]:
    """What a non-regular, non-directory file is (None for regular files and directories)."""
    for test, kind in ((_stat.S_ISFIFO, "FIFO (named pipe)"), (_stat.S_ISCHR, "character device"),
                       (_stat.S_ISBLK, "block device"), (_stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return None


def available(algo: str) -> bool:
    if algo == "xxh3_128":
        return HAS_XXHASH
    if algo == "blake3":
        return HAS_BLAKE3
    return algo in ("sha256", "md5")


def available_algorithms() -> List[str]:
    return [a for a in SUPPORTED if available(a)]


def choose_algorithm(requested: str, previous: Optional[str],
                     collision_resistant: bool = False) -> str:
    """The algorithm to use: ``requested`` unless ``auto``; then the lock's own algorithm
    while it is importable, else the fastest importable one (among COLLISION_RESISTANT
    when asked). Raises ValueError when a requested algorithm is not importable here."""
    if requested and requested != "auto":
        if requested not in SUPPORTED:
            raise ValueError("unknown hash algorithm %r" % requested)
        if not available(requested):
            raise ValueError("hash algorithm %s needs the Python package %s on this host"
                             % (requested, "xxhash" if requested == "xxh3_128" else requested))
        return requested
    allowed = COLLISION_RESISTANT if collision_resistant else SUPPORTED
    if previous and previous in allowed and available(previous):
        return previous
    for algo in PREFERENCE:
        if algo in allowed and available(algo):
            return algo
    return "sha256"  # pragma: no cover - hashlib always has it


def new_hasher(algo: str) -> Any:
    if algo == "xxh3_128":
        return xxhash.xxh3_128()
    if algo == "blake3":
        return _blake3.blake3()
    return hashlib.new(algo)


def hash_bytes(algo: str, data: bytes) -> str:
    h = new_hasher(algo)
    h.update(data)
    return h.hexdigest()


def hash_file(path: str, algo: str, size: Optional[int] = None) -> str:
    """Hex digest of a file's content; small files in one read, big ones in 1 MiB chunks."""
    h = new_hasher(algo)
    with open(path, "rb", buffering=0) as f:
        if size is not None and size <= SMALL:
            data = f.read(SMALL)  # bounded even when the file grew since its stat
            while data:  # a file that grew since its stat: read the rest too
                h.update(data)
                data = f.read(CHUNK)
            return h.hexdigest()
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def _sig(st: os.stat_result) -> Tuple[int, int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


class IgnoreMatcher:
    """gitignore-like patterns: ``*.tmp`` matches a name at any depth, ``cache/`` only
    directories, and a pattern with a ``/`` inside matches the path relative to the
    walked root (``raw/*.csv``)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        names: List[str] = []
        paths: List[str] = []
        dir_names: List[str] = []
        dir_paths: List[str] = []
        if self.patterns:
            import fnmatch  # only when there are patterns
        for pat in self.patterns:
            pat = pat.strip()
            if not pat:
                continue
            dir_only = pat.endswith("/")
            pat = pat.rstrip("/").lstrip("/") if "/" in pat.rstrip("/") else pat.rstrip("/")
            target = (dir_paths if "/" in pat else dir_names) if dir_only else \
                (paths if "/" in pat else names)
            target.append(fnmatch.translate(pat))
        self._names = self._compile(names)
        self._paths = self._compile(paths)
        self._dir_names = self._compile(dir_names)
        self._dir_paths = self._compile(dir_paths)
        self.active = bool(names or paths or dir_names or dir_paths)

    @staticmethod
    def _compile(parts: List[str]) -> Optional[Callable[[str], Any]]:
        return re.compile("|".join("(?:%s)" % p for p in parts)).match if parts else None

    def __call__(self, rel: str, name: str, is_dir: bool) -> bool:
        if self._names and self._names(name):
            return True
        if self._paths and self._paths(rel):
            return True
        if is_dir:
            if self._dir_names and self._dir_names(name):
                return True
            if self._dir_paths and self._dir_paths(rel):
                return True
        return False


NO_IGNORE = IgnoreMatcher(())


class StatCache:
    """Per-file hashes keyed by stat signature, plus one stat signature per walked tree.

    The per-file part is loaded lazily: a no-op check that matches every tree signature
    never reads it. ``save`` keeps only the entries seen in this run (removed files drop
    out) and writes nothing when nothing changed.
    """

    def __init__(self, path: Optional[str], algo: str) -> None:
        self.path = path
        self.algo = algo
        self._files: Optional[Dict[str, tuple]] = None
        self._used: Dict[str, tuple] = {}
        self._keep: List[tuple] = []     # (root, walked files) of trees whose signature matched
        self._files_dirty = False
        self._trees: Dict[str, list] = self._read(self._trees_path()) or {}
        self._trees_used: Dict[str, list] = {}
        self.stats = {"files": 0, "hashed": 0, "cached": 0, "bytes_hashed": 0}

    # -- storage ----------------------------------------------------------------------
    def _trees_path(self) -> Optional[str]:
        return self.path + ".trees" if self.path else None

    def _read(self, path: Optional[str]) -> Optional[dict]:
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                data = marshal.loads(f.read())
        except (OSError, EOFError, ValueError, TypeError):
            return None
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT \
                or data.get("algo") != self.algo or not isinstance(data.get("entries"), dict):
            return None
        return data["entries"]

    def _files_map(self) -> Dict[str, tuple]:
        if self._files is None:
            self._files = self._read(self.path) or {}
        return self._files

    def save(self) -> bool:
        """Write the parts that changed, atomically; True when anything was written."""
        if not self.path:
            return False
        written = False
        if self._files is not None:
            files = self._files
            keep = {_join(root, rel) for root, walked in self._keep for rel, st in walked if st is not None}
            keep.update(self._used)
            if self._files_dirty or set(files) != keep:
                entries = {p: files[p] for p in keep if p in files}
                entries.update(self._used)
                write_bytes_atomic(self.path, marshal.dumps(
                    {"format": CACHE_FORMAT, "algo": self.algo, "entries": entries}, 2), fsync=False)
                written = True
        if self._trees_used != self._trees:
            write_bytes_atomic(self._trees_path(), marshal.dumps(
                {"format": CACHE_FORMAT, "algo": self.algo, "entries": self._trees_used}, 2),
                fsync=False)
            written = True
        self._files_dirty = False
        return written

    # -- trees ------------------------------------------------------------------------
    def tree_lookup(self, key: str, signature: Any, root: str, walked: list) -> Optional[list]:
        """The tree's [signature, hash, files, size] when its stat signature matches.
        ``walked`` (the walk's (rel, stat) list under ``root``) keeps those files' per-file
        entries should the per-file cache be rewritten in this run."""
        entry = self._trees.get(key)
        if entry is not None and entry[0] == signature:
            self._trees_used[key] = entry
            self._keep.append((root, walked))
            return entry
        return None

    def tree_record(self, key: str, signature: Optional[str], value: list) -> None:
        """Remember a tree's hash under its stat signature; None (a file in it changed
        just now) means: do not trust a signature next time, rehash from the file cache."""
        if signature is None:
            self._trees_used.pop(key, None)
        else:
            self._trees_used[key] = [signature] + list(value)

    # -- files ------------------------------------------------------------------------
    def file_hashes(self, items: List[Tuple[str, os.stat_result]]) -> List[str]:
        """Hex digests for (path, stat) pairs: cached where the signature matches, hashed
        (in threads when there are several) otherwise."""
        files = self._files_map()
        used = self._used
        now = time.time_ns()
        out: List[Optional[str]] = [None] * len(items)
        todo: List[int] = []
        for i, (path, st) in enumerate(items):
            hit = used.get(path) or files.get(path)
            if hit is not None and hit[:5] == _sig(st):
                out[i] = hit[5]
                self._used[path] = hit
            else:
                todo.append(i)
        self.stats["files"] += len(items)
        self.stats["cached"] += len(items) - len(todo)
        if todo:
            algo = self.algo

            def one(i: int) -> str:
                path, st = items[i]
                return hash_file(path, algo, st.st_size)

            if len(todo) == 1:
                digests = [one(todo[0])]
            else:
                from concurrent.futures import ThreadPoolExecutor  # only when there is work
                with ThreadPoolExecutor(max_workers=min(_WORKERS, len(todo))) as pool:
                    digests = list(pool.map(one, todo))
            self._files_dirty = True
            for i, digest in zip(todo, digests):
                path, st = items[i]
                out[i] = digest
                self.stats["hashed"] += 1
                self.stats["bytes_hashed"] += st.st_size
                if now - max(st.st_mtime_ns, st.st_ctime_ns) >= RACY_NS:
                    self._used[path] = _sig(st) + (digest,)
                else:
                    self._used.pop(path, None)
        return out  # type: ignore[return-value]


class Entry(dict):
    """What is known of one path: kind (file, dir, glob, missing), hash, files, size and,
    for trees, the manifest {relative path: hash} (kept out of the lock itself)."""


_BY_NAME = operator.attrgetter("name")
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)


def _walk(dir_fd: int, prefix: str, ignore: IgnoreMatcher, out: list,
          stack: Tuple[Tuple[int, int], ...], specials: Optional[list] = None) -> None:
    """Append (relative path, stat) of the regular files under an open directory.

    Depth-first, names sorted in each directory; symlinks are followed, loops refused; a
    broken symlink is recorded with stat None. Every stat is relative to the directory's
    descriptor (fstatat), which spares the kernel a full path lookup per file. FIFOs,
    devices and sockets are never opened: left out, or listed in ``specials`` as
    (relative path, kind) when the caller wants to refuse them.
    """
    with os.scandir(dir_fd) as it:
        entries = sorted(it, key=_BY_NAME)
    active = ignore.active
    for e in entries:
        name = e.name
        rel = prefix + name
        try:
            is_dir = e.is_dir()
        except OSError:
            is_dir = False
        if active and ignore(rel, name, is_dir):
            continue
        if is_dir:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                st = os.fstat(fd)
                ident = (st.st_dev, st.st_ino)
                if ident not in stack:  # else a symlink back up the tree
                    _walk(fd, rel + "/", ignore, out, stack + (ident,), specials)
            finally:
                os.close(fd)
            continue
        try:
            st = e.stat()
        except OSError:  # broken symlink: its target is part of the content
            out.append((rel, None))
            continue
        if _stat.S_ISREG(st.st_mode):
            out.append((rel, st))
        elif specials is not None:
            specials.append((rel, special_kind(st.st_mode) or "special file"))


def walk(root: str, prefix: str, ignore: IgnoreMatcher, out: list,
         specials: Optional[list] = None) -> None:
    fd = os.open(root, _DIR_FLAGS)
    try:
        st = os.fstat(fd)
        _walk(fd, prefix, ignore, out, ((st.st_dev, st.st_ino),), specials)
    finally:
        os.close(fd)


def _join(root: str, rel: str) -> str:
    return root + rel if root.endswith("/") else root + "/" + rel


def is_glob(spec: str) -> bool:
    return any(ch in spec for ch in "*?[")


class Hasher:
    """Hashes files, directory trees and globs through one StatCache."""

    def __init__(self, cache: StatCache) -> None:
        self.cache = cache
        self.algo = cache.algo
        self._manifests: Dict[Tuple[str, Tuple[str, ...]], Dict[str, str]] = {}

    def _tree(self, key: str, root: str, files: List[Tuple[str, Optional[os.stat_result]]],
              kind: str, want_manifest: bool) -> Entry:
        """Hash of a tree: (rel, hash) lines of its files, paths relative to ``root``."""
        sig_items = []
        newest = 0
        total = 0
        for rel, st in files:
            if st is None:  # a broken symlink: its target is what there is to compare
                sig_items.append((rel, os.readlink(_join(root, rel))))
                continue
            mtime, ctime, size = st.st_mtime_ns, st.st_ctime_ns, st.st_size
            sig_items.append((rel, size, mtime, ctime, st.st_ino, st.st_dev))
            total += size
            if mtime > newest:
                newest = mtime
            if ctime > newest:
                newest = ctime
        racy = time.time_ns() - newest < RACY_NS
        signature = hash_bytes(self.algo, marshal.dumps(sig_items, 2))
        if not want_manifest:
            hit = self.cache.tree_lookup(key, signature, root, files)
            if hit is not None:
                self.cache.stats["files"] += len(files)
                self.cache.stats["cached"] += len(files)
                return Entry(kind=kind, hash=hit[1], files=hit[2], size=hit[3])
        digests = iter(self.cache.file_hashes([(_join(root, r), st) for r, st in files if st is not None]))
        manifest: Dict[str, str] = {}
        lines = []
        for rel, st in files:
            digest = next(digests) if st is not None else "symlink:" + hash_bytes(
                self.algo, os.readlink(_join(root, rel)).encode("utf-8", "surrogateescape"))
            manifest[rel] = digest
            lines.append(rel.encode("utf-8", "surrogateescape") + b"\0" + digest.encode() + b"\n")
        tree_hash = hash_bytes(self.algo, b"".join(lines))
        self.cache.tree_record(key, None if racy else signature, [tree_hash, len(files), total])
        return Entry(kind=kind, hash=tree_hash, files=len(files), size=total, manifest=manifest)

    def path(self, spec: str, base: str, ignore: IgnoreMatcher = NO_IGNORE,
             want_manifest: bool = False, refuse_special: bool = False) -> Entry:
        """Hash ``spec`` (a file, a directory or a glob, relative to ``base``).

        A missing path gives kind ``missing`` (callers decide whether that is an error).
        Trees return their manifest when they had to be (re)hashed or when asked. A FIFO,
        device or socket named by ``spec`` itself raises SpecialFileError (opening it could
        hang); one inside a tree or matched by a glob is left out, or with
        ``refuse_special`` (inputs: a dep must not change unseen) raises it too.
        """
        full = os.path.normpath(os.path.join(base, spec))
        specials: Optional[list] = [] if refuse_special else None
        if is_glob(spec):
            import glob
            files: List[Tuple[str, Optional[os.stat_result]]] = []
            for match in sorted(glob.glob(full, recursive=True)):
                rel = os.path.relpath(match, base)
                try:
                    st = os.stat(match)
                except OSError:
                    continue
                if _stat.S_ISDIR(st.st_mode):
                    walk(match, rel + "/", ignore, files, specials)
                elif ignore.active and ignore(rel, os.path.basename(match), False):
                    continue
                elif _stat.S_ISREG(st.st_mode):
                    files.append((rel, st))
                elif specials is not None:
                    specials.append((rel, special_kind(st.st_mode) or "special file"))
            _refuse(specials, base)
            if not files:
                return Entry(kind="missing", hash=None, files=0, size=0)
            files.sort(key=lambda item: item[0])
            root = os.path.normpath(base)
            return self._remember("glob:" + full, ignore,
                                  self._tree("glob:" + full, root, files, "glob", want_manifest))
        try:
            st = os.stat(full)
        except OSError:
            return Entry(kind="missing", hash=None, files=0, size=0)
        if _stat.S_ISDIR(st.st_mode):
            files = []
            walk(full, "", ignore, files, specials)
            _refuse(specials, full)
            return self._remember("dir:" + full, ignore,
                                  self._tree("dir:" + full, full, files, "dir", want_manifest))
        if not _stat.S_ISREG(st.st_mode):  # never opened, whoever asks: it could hang
            raise SpecialFileError(full, special_kind(st.st_mode) or "special file")
        # A single file goes through the small tree cache too, so that a no-op check
        # never has to load the per-file cache just for one file.
        key, sig = "file:" + full, _sig(st)
        if not want_manifest:
            hit = self.cache.tree_lookup(key, sig, os.path.dirname(full), [(os.path.basename(full), st)])
            if hit is not None:
                self.cache.stats["files"] += 1
                self.cache.stats["cached"] += 1
                return Entry(kind="file", hash=hit[1], files=1, size=st.st_size)
        digest = self.cache.file_hashes([(full, st)])[0]
        racy = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS
        self.cache.tree_record(key, None if racy else sig, [digest, 1, st.st_size])
        return Entry(kind="file", hash=digest, files=1, size=st.st_size)

    def _remember(self, key: str, ignore: IgnoreMatcher, entry: Entry) -> Entry:
        if "manifest" in entry:
            self._manifests[(key, ignore.patterns)] = entry["manifest"]
        return entry

    def manifest(self, spec: str, base: str, ignore: IgnoreMatcher = NO_IGNORE) -> Dict[str, str]:
        """The {relative path: hash} map of a tree (or {spec: hash} of a file); a tree
        already hashed in this run is not walked again (call path() to rehash it)."""
        full = os.path.normpath(os.path.join(base, spec))
        for kind in ("dir:", "glob:"):
            memo = self._manifests.get((kind + full, ignore.patterns))
            if memo is not None:
                return memo
        entry = self.path(spec, base, ignore, want_manifest=True)
        if entry["kind"] in ("dir", "glob"):
            return entry["manifest"]
        if entry["kind"] == "file":
            return {spec: entry["hash"]}
        return {}


def _refuse(specials: Optional[list], root: str) -> None:
    """Raise SpecialFileError for the first special file a walk listed, if any."""
    if specials:
        rel, kind = specials[0]
        raise SpecialFileError(os.path.join(root, rel), kind)


def public(entry: Dict[str, Any]) -> Dict[str, Any]:
    """An Entry without its manifest (what goes into the lock and the key)."""
    return {k: v for k, v in entry.items() if k != "manifest"}
