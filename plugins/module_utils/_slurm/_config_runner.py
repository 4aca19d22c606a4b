# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""slurm_config's runner: render the cluster's three files, check them and this host against
the request, write only what differs, and say what Slurm needs to take the change.

The files are the same on every host (``_conf``). What only this host can know is checked
here, for the node the host runs (``local_node``): a GPU (or any of a MIG device's files) the
request gives it that has no device file is refused before anything is written (slurmd would fail at start with "Invalid
GRES"); CPUs or memory below the request are not an input error but a node that must not take
jobs, returned as ``local_mismatch`` for the role to drain it with that reason.
"""
from __future__ import annotations

import os
import stat
from typing import Any, Dict, List, Optional

from .._core._atomic_file import write_bytes_atomic
from .._core._errors import InvalidInputError, KvmError
from .._core._runner import ObjectRunner
from . import _conf

FILE_MODE = 0o644


class SlurmConfigFiles:
    """The service: reads and writes the config directory (the only I/O of this runner)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def read(self, name: str) -> Optional[str]:
        try:
            with open(os.path.join(self.directory, name), encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write(self, name: str, text: str) -> None:
        try:
            write_bytes_atomic(os.path.join(self.directory, name), text.encode("utf-8"), mode=FILE_MODE)
        except OSError as exc:
            raise KvmError("cannot write %s: %s" % (os.path.join(self.directory, name), exc.strerror or exc)) from None

    @staticmethod
    def is_char_device(path: str) -> bool:
        try:
            return stat.S_ISCHR(os.stat(path).st_mode)
        except OSError:
            return False

    @staticmethod
    def host_cpus() -> int:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    @staticmethod
    def host_memory_mb() -> int:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
        return 0


class SlurmConfigRunner(ObjectRunner):
    def __init__(self, module: Any, service: SlurmConfigFiles) -> None:
        super().__init__(module, service)
        self.request = module.params

    def validate(self) -> None:
        _conf.check_cluster(self.request)
        local = self.request.get("local_node")
        if local:
            names = [n["name"] for n in self.request["nodes"]]
            if local not in names:
                raise InvalidInputError("local_node", local, "is not among nodes (%s)" % ", ".join(names),
                                        "give this host's node name as declared under nodes, or leave local_node out")
            self._check_local_gpus(self._node(local))

    def _node(self, name: str) -> Dict[str, Any]:
        return next(n for n in self.request["nodes"] if n["name"] == name)

    def _check_local_gpus(self, node: Dict[str, Any]) -> None:
        index = self.request["nodes"].index(node)
        for j, gpu in enumerate(node.get("gpus") or []):
            mig = gpu.get("files") is not None
            for option, path, _shareable in _conf.gpu_files("nodes[%d].gpus[%d]" % (index, j), gpu):
                if self.service.is_char_device(path):
                    continue
                if not mig:
                    raise InvalidInputError(
                        option, path, "is not a character device on this host, so node %s does not have this GPU" % node["name"],
                        "declare only the GPUs the node has (its nvidia_smi_info or pci_info facts), or load its driver first")
                # A MIG device's capability nodes exist only while its GPU and compute instances do.
                raise InvalidInputError(
                    option, path, "is not a character device on this host, so node %s does not have this MIG device" % node["name"],
                    "declare only the MIG devices the node has now (nvidia_smi_info's mig_devices), or create them first "
                    "(mlinfra.kvm.nvidia_mig)")

    def local_mismatch(self) -> List[str]:
        local = self.request.get("local_node")
        if not local:
            return []
        node = self._node(local)
        reasons = []
        if node.get("cpus") and int(node["cpus"]) > self.service.host_cpus():
            reasons.append("declared %s CPUs, host has %d" % (node["cpus"], self.service.host_cpus()))
        if node.get("memory_mb") and int(node["memory_mb"]) > self.service.host_memory_mb():
            reasons.append("declared %s MB memory, host has %d" % (node["memory_mb"], self.service.host_memory_mb()))
        return reasons

    def converge(self) -> Dict[str, Any]:
        wanted = _conf.render_all(self.request)
        before = {name: self.service.read(name) for name in wanted}
        changed = [name for name in wanted if before[name] != wanted[name]]
        for name in changed:
            self.tracker.add(name, before[name], wanted[name])
            self.tracker.act("write %s" % os.path.join(self.service.directory, name), self.service.write, name, wanted[name])
        restart, reconfigure = _conf.daemons_to_restart(before, wanted)
        result = {
            "changed": bool(changed),
            "files": [os.path.join(self.service.directory, name) for name in changed],
            "actions": self.tracker.actions,
            "restart_required": restart,
            "reconfigure_required": reconfigure,
            "local_mismatch": self.local_mismatch(),
            "nodes": [n["name"] for n in self.request["nodes"]],
        }
        if self.module._diff:
            result["diff"] = [{"before_header": os.path.join(self.service.directory, name), "before": before[name] or "",
                               "after_header": os.path.join(self.service.directory, name), "after": wanted[name]}
                              for name in changed]
        return result


def run_slurm_config(module: Any) -> Dict[str, Any]:
    return SlurmConfigRunner(module, SlurmConfigFiles(module.params["config_dir"])).run()
