# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""cloud_init's runner and service: make the NoCloud seed ISO at ``dest`` hold the rendered
seed, rebuilding it only when the content hash differs.

What the seed holds is decided by the pure functions of ``_cloudinit``; here the service
(:class:`SeedService`) is the only code that reads the file system or runs the ISO tool, and
the runner compares the hash stored in the ISO with the wanted one and performs the one side
effect a run needs (build, chmod or remove) through ``tracker.act``, so check mode takes the
same decisions and writes nothing. It sits in ``_libvirt`` because the seed is a libvirt
guest's cdrom, next to its renderer; it does not talk to libvirt itself.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from typing import Any, Dict, List, Optional

from .._core._command import run_bounded
from .._core._errors import ConflictError, InvalidInputError, KvmError
from .._core._runner import ObjectRunner
from . import _cloudinit as C

SEED_MODE = 0o600
SEED_BUILD_TIMEOUT_S = 60


def cloud_init_spec() -> Dict[str, Any]:
    return dict(
        dest=dict(type="path", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        user_data=dict(type="raw", no_log=True),
        meta_data=dict(type="raw"),
        instance_id=dict(type="str"),
        network_config=dict(type="raw"),
        force=dict(type="bool", default=False),
    )


class SeedService:
    """The only code that touches the file system or runs the ISO tool."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def file_mode(self, path: str) -> Optional[int]:
        try:
            return stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            return None

    @staticmethod
    def is_dir(path: str) -> bool:
        return os.path.isdir(path)

    @staticmethod
    def size(path: str) -> int:
        return os.path.getsize(path)

    def iso_ids(self, path: str) -> Optional[Dict[str, str]]:
        return C.read_iso_ids(path)

    def tool_argv(self) -> List[str]:
        genisoimage = self.module.get_bin_path("genisoimage")
        if genisoimage:
            return [genisoimage]
        xorriso = self.module.get_bin_path("xorriso")
        if xorriso:
            return [xorriso, "-as", "mkisofs"]
        raise KvmError("neither genisoimage nor xorriso is installed on the host that builds the seed; "
                       "install one (apt-get install genisoimage)")

    def build(self, dest: str, files: Dict[str, str], appid: str) -> None:
        """Write the ISO next to ``dest`` and rename it into place; the file system's refusal
        (a missing or read-only directory, a full disk) is reported as such, not as a bug."""
        try:
            self._build(dest, files, appid)
        except OSError as exc:
            raise KvmError("cannot write the seed ISO %s: %s; check that its directory exists, is writable and has space"
                           % (dest, exc.strerror or exc)) from None

    def _build(self, dest: str, files: Dict[str, str], appid: str) -> None:
        tool = self.tool_argv()
        # The rendered files hold secrets: a private directory, files 0600, removed afterwards.
        workdir = tempfile.mkdtemp(prefix="mlkvm-seed-")
        fd, tmp_iso = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".%s." % os.path.basename(dest),
                                       suffix=".tmp")
        os.close(fd)
        try:
            paths = []
            for name in sorted(files):
                path = os.path.join(workdir, name)
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w",
                               encoding="utf-8") as handle:
                    handle.write(files[name])
                paths.append(path)
            argv = tool + ["-output", tmp_iso, "-volid", C.VOLUME_ID, "-joliet", "-rock",
                           "-appid", appid, "-input-charset", "utf-8", "-quiet"] + paths
            # A seed is a few KiB: a minute is ample, and a wedged tool must not hang the play.
            rc, out, err = run_bounded(argv, timeout_s=SEED_BUILD_TIMEOUT_S)
            if rc != 0:
                raise KvmError("building the seed ISO failed: %s exited %d: %s"
                               % (os.path.basename(tool[0]), rc, (err or out).strip()),
                               argv=argv, rc=rc, stderr=err)
            os.chmod(tmp_iso, SEED_MODE)
            os.replace(tmp_iso, dest)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            if os.path.exists(tmp_iso):
                os.unlink(tmp_iso)

    def chmod(self, path: str, mode: int) -> None:
        try:
            os.chmod(path, mode)
        except OSError as exc:
            raise KvmError("cannot set the mode of %s: %s" % (path, exc.strerror or exc)) from None

    def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except OSError as exc:
            raise KvmError("cannot remove %s: %s" % (path, exc.strerror or exc)) from None


class SeedRunner(ObjectRunner):
    def __init__(self, module: Any, service: SeedService) -> None:
        super().__init__(module, service)
        self.dest = ""

    def validate(self) -> None:
        self.dest = self.validate_dest()

    def validate_dest(self) -> str:
        dest = self.params["dest"]
        if not dest or not os.path.isabs(dest):
            raise InvalidInputError("dest", dest, "is not an absolute path", "give the full path of the ISO file")
        parent = os.path.dirname(dest)
        if not self.service.is_dir(parent):
            raise InvalidInputError("dest", dest, "is in a directory that does not exist (%s)" % parent,
                                    "create the directory first (ansible.builtin.file state=directory)")
        if self.service.is_dir(dest):
            raise InvalidInputError("dest", dest, "is a directory", "give the path of the ISO file inside it")
        return dest

    def current_digest(self, dest: str, exists: bool) -> Optional[str]:
        """The content hash recorded in the ISO at ``dest``; refuses to clobber foreign files."""
        if not exists:
            return None
        ids = self.service.iso_ids(dest)
        if ids is None:
            if self.service.size(dest) > 0 and not self.params["force"]:
                raise ConflictError(
                    "dest %s exists and is not an ISO image; refusing to overwrite it. Remove it, "
                    "choose another dest, or set force=true" % dest, dest=dest)
            return None
        if ids["volume_id"] != C.VOLUME_ID:
            return None
        return C.digest_from_appid(ids["application_id"])

    def converge(self) -> Dict[str, Any]:
        mode = self.service.file_mode(self.dest)
        exists = mode is not None
        if self.params["state"] == "absent":
            return self.ensure_absent(self.dest, exists)
        return self.ensure_present(self.dest, exists, mode)

    def ensure_present(self, dest: str, exists: bool, mode: Optional[int]) -> Dict[str, Any]:
        p = self.params
        files, iid = C.render_seed(p["user_data"], p["meta_data"], p["network_config"], p["instance_id"])
        digest = C.content_hash(files)
        current = self.current_digest(dest, exists)
        if self.tracker.add("content_sha256", current, digest):
            # A rebuild also fixes the mode (the new file is written 0600).
            self.tracker.act("build seed ISO", self.service.build, dest, files, C.appid_for(digest))
            self.tracker.add("mode", "%04o" % mode if exists else None, "%04o" % SEED_MODE,
                             active=exists and mode != SEED_MODE)
        elif mode != SEED_MODE:
            self.tracker.add("mode", "%04o" % mode, "%04o" % SEED_MODE)
            self.tracker.act("chmod %04o" % SEED_MODE, self.service.chmod, dest, SEED_MODE)
        summary = C.summary(files)
        before = {"dest": dest, "state": "present" if exists else "absent", "content_sha256": current,
                  "mode": "%04o" % mode if exists else None}
        after = {"dest": dest, "state": "present", "content_sha256": digest, "mode": "%04o" % SEED_MODE,
                 "instance_id": iid, "files": summary}
        return self.result(dest, digest, iid, summary, before, after, mode="%04o" % SEED_MODE)

    def ensure_absent(self, dest: str, exists: bool) -> Dict[str, Any]:
        before = {"dest": dest, "state": "present" if exists else "absent"}
        if exists:
            self.tracker.add("state", "present", "absent")
            self.tracker.act("remove seed ISO", self.service.remove, dest)
        return self.result(dest, None, None, [], before, {"dest": dest, "state": "absent"})

    def result(self, dest: str, digest: Optional[str], iid: Optional[str], files: List[Dict[str, Any]],
               before: Dict[str, Any], after: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
        out: Dict[str, Any] = {"changed": self.tracker.changed, "actions": self.tracker.actions, "dest": dest,
                               "content_sha256": digest, "instance_id": iid, "files": files}
        out.update(extra)
        return self.with_diff(out, before, after)


def run_cloud_init(module: Any) -> Dict[str, Any]:
    if not C.HAS_YAML:
        module.fail_json(msg="PyYAML is required on the host that builds the seed (pip install PyYAML)")
    return SeedRunner(module, SeedService(module)).run()
