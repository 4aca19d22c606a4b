# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Slurm cluster's configuration as data: checked, rendered, and compared.

One request describes the whole cluster (controller, nodes with their GPUs, partitions), and
every host renders the same three files from it: ``slurm.conf``, ``gres.conf`` and
``cgroup.conf``. Slurm wants them identical on every node (it hashes slurm.conf), so nothing
here depends on the host that renders them; the host-side checks live in the runner.

``check_cluster`` refuses what slurmctld would reject (a partition naming an unknown node, two
nodes at one address, a GPU without a device file or with both File and MultipleFiles, typed and
untyped GPUs on one node, a GRES type with characters Slurm's parser splits on), before
anything is written. ``daemons_to_restart`` says which changes Slurm can take with ``scontrol
reconfigure`` and which need a restart (slurm.conf(5): the node set, ports, plugins, state
location; gres.conf and cgroup.conf are read by slurmd at start).
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._core._errors import InvalidInputError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A value Slurm's parser reads as one token: no space, '#', '=' or control characters.
VALUE_RE = re.compile(r"^[^\s#=\x00-\x1f\x7f]+$")
EXTRA_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{1,63}$")

# Keys a running cluster only takes on a restart of every daemon (slurm.conf(5), "scontrol
# reconfigure": ports, authentication, the controller, plugins, state location).
RESTART_KEYS = frozenset((
    "AuthType", "AuthInfo", "CryptoType", "SlurmctldHost", "SlurmctldPort", "SlurmdPort",
    "StateSaveLocation", "SlurmdSpoolDir", "SlurmUser", "SelectType", "SelectTypeParameters",
    "ProctrackType", "TaskPlugin", "GresTypes", "AccountingStorageType", "AccountingStorageHost",
    "AccountingStoragePort", "AccountingStoragePass", "JobAcctGatherType", "PluginDir", "MpiDefault",
))
# Files a slurmd reads at start only.
SLURMD_START_FILES = ("gres.conf", "cgroup.conf")


def _bad(option: str, value: Any, problem: str, fix: str) -> InvalidInputError:
    return InvalidInputError(option, value, problem, fix)


def check_name(option: str, value: str) -> None:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise _bad(option, value, "is not a Slurm name", "use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter "
                   "or digit")


def check_value(option: str, value: Any) -> None:
    if not VALUE_RE.match(str(value)):
        raise _bad(option, value, "holds a space, '#', '=' or a control character, which slurm.conf would split or cut",
                   "give a single token")


def check_cluster(req: Dict[str, Any]) -> None:
    """Raise InvalidInputError for a cluster slurmctld would reject or misread."""
    check_name("cluster_name", req["cluster_name"])
    check_name("controller.host", req["controller"]["host"])
    if req["controller"].get("address"):
        check_value("controller.address", req["controller"]["address"])
    nodes = req["nodes"]
    if not nodes:
        raise _bad("nodes", nodes, "is empty", "declare at least one node (a slurmd host)")
    _check_nodes(nodes)
    _check_partitions(req["partitions"], [n["name"] for n in nodes])
    for key, value in sorted((req.get("extra") or {}).items()):
        if not EXTRA_KEY_RE.match(key):
            raise _bad("extra", key, "is not a slurm.conf key", "use the key as slurm.conf(5) spells it (letters and digits)")
        if key in RESTART_KEYS or key in _MANAGED_KEYS:
            raise _bad("extra.%s" % key, value, "is set by this module from its own options",
                       "use the module's option for it instead of extra")
        check_value("extra.%s" % key, value)


def _check_nodes(nodes: Sequence[Dict[str, Any]]) -> None:
    seen_names: Dict[str, int] = {}
    seen_addrs: Dict[str, str] = {}
    for i, node in enumerate(nodes):
        where = "nodes[%d]" % i
        check_name(where + ".name", node["name"])
        if node["name"] in seen_names:
            raise _bad(where + ".name", node["name"], "is declared twice (also nodes[%d])" % seen_names[node["name"]],
                       "declare each node once")
        seen_names[node["name"]] = i
        address = node.get("address") or node["name"]
        check_value(where + ".address", address)
        if address in seen_addrs:
            raise _bad(where + ".address", address, "is also node %s's address" % seen_addrs[address],
                       "give each node its own address")
        seen_addrs[address] = node["name"]
        for key in ("cpus", "memory_mb"):
            if node.get(key) is not None and int(node[key]) < 1:
                raise _bad("%s.%s" % (where, key), node[key], "is below 1", "give a positive number or leave it out")
        _check_gpus(where, node.get("gpus") or [])
        if node.get("shards") is not None and int(node["shards"]) < 0:
            raise _bad(where + ".shards", node["shards"], "is negative", "give 0 (no sharing) or more")
        if node.get("shards") and not node.get("gpus"):
            raise _bad(where + ".shards", node["shards"], "shares GPUs on a node that declares none",
                       "declare the node's gpus, or leave shards out")


def gpu_files(option: str, gpu: Dict[str, Any]) -> List[Tuple[str, str, bool]]:
    """(option, path, shareable) of each device file of one GPU entry: its ``file`` (a whole GPU),
    or each of its ``files`` (a MIG device). Only the first of ``files``, the parent GPU's device
    file, is shareable: every MIG device of that GPU needs it."""
    has_file, has_files = gpu.get("file") is not None, gpu.get("files") is not None
    if has_file == has_files:
        raise _bad(option, {"file": gpu.get("file"), "files": gpu.get("files")},
                   "gives both file and files" if has_file else "gives neither file nor files",
                   "give file for a whole GPU (e.g. /dev/nvidia0), or files for a MIG device (its GPU's device file, then "
                   "its GPU and compute instance capability files: nvidia_smi_info's mig_devices[].files)")
    if has_file:
        return [(option + ".file", gpu["file"], False)]
    if not gpu["files"]:
        raise _bad(option + ".files", gpu["files"], "is empty", "give the MIG device's files, or file for a whole GPU")
    return [("%s.files[%d]" % (option, k), path, k == 0) for k, path in enumerate(gpu["files"])]


def _check_gpus(where: str, gpus: Sequence[Dict[str, Any]]) -> None:
    owners: Dict[str, Tuple[int, bool]] = {}
    for j, gpu in enumerate(gpus):
        option = "%s.gpus[%d]" % (where, j)
        for file_option, path, shareable in gpu_files(option, gpu):
            path = path or ""
            if not path.startswith("/") or not VALUE_RE.match(path):
                raise _bad(file_option, path, "is not an absolute device path", "give the GPU's device file, e.g. /dev/nvidia0")
            if gpu.get("files") is not None and "," in path:
                raise _bad(file_option, path, "holds ',', which MultipleFiles reads as a separator", "give one path per item")
            if path in owners:
                first, first_shareable = owners[path]
                if first == j:
                    raise _bad(file_option, path, "is listed twice in the same GPU", "list each device file once")
                if not (shareable and first_shareable):
                    raise _bad(file_option, path, "is also gpus[%d]'s device" % first,
                               "give each GPU its own device file (only MIG devices share their GPU's, first in files)")
            else:
                owners[path] = (j, shareable)
        if gpu.get("type"):
            if not NAME_RE.match(gpu["type"]) or ":" in gpu["type"]:
                raise _bad(option + ".type", gpu["type"], "is not a GRES type name", "use letters, digits, '.', '_' or '-'")
    # slurm.conf(5), Gres: "It is forbidden to specify both an untyped GRES and a typed GRES with the same
    # <name>" - a node with MIG devices (typed by profile) types its whole GPUs too.
    if len({bool(gpu.get("type")) for gpu in gpus}) > 1:
        raise _bad(where + ".gpus", [gpu.get("type") for gpu in gpus],
                   "mixes typed and untyped GPUs, which slurm.conf forbids for one GRES name",
                   "give every GPU of the node a type (a MIG profile, or the model such as nvidia_h200), or none")


def _check_partitions(partitions: Sequence[Dict[str, Any]], node_names: List[str]) -> None:
    if not partitions:
        raise _bad("partitions", partitions, "is empty", "declare at least one partition")
    seen: Dict[str, int] = {}
    defaults = []
    for i, part in enumerate(partitions):
        where = "partitions[%d]" % i
        check_name(where + ".name", part["name"])
        if part["name"] in seen:
            raise _bad(where + ".name", part["name"], "is declared twice (also partitions[%d])" % seen[part["name"]],
                       "declare each partition once")
        seen[part["name"]] = i
        for name in part.get("nodes") or []:
            if name not in node_names:
                raise _bad(where + ".nodes", name, "is not a declared node (nodes: %s)" % ", ".join(node_names),
                           "declare it under nodes, or remove it from the partition")
        if part.get("max_time"):
            check_value(where + ".max_time", part["max_time"])
        if part.get("default"):
            defaults.append(part["name"])
    if len(defaults) > 1:
        raise _bad("partitions", defaults, "has more than one default partition", "mark one partition default")


# -- rendering --------------------------------------------------------------------------------
_MANAGED_KEYS = frozenset(("ClusterName", "SlurmctldLogFile", "SlurmdLogFile", "SlurmctldPidFile", "SlurmdPidFile",
                           "ReturnToService", "AccountingStorageTRES", "AccountingStorageEnforce", "JobCompType"))
HEADER = "# Managed by mlinfra.kvm.slurm_config: edits here are replaced on the next run.\n"


def _gres_types(node: Dict[str, Any]) -> List[str]:
    types = []
    if node.get("gpus"):
        types.append("gpu")
    if node.get("shards"):
        types.append("shard")
    return types


def node_gres(node: Dict[str, Any]) -> str:
    """The node line's Gres= value: ``gpu:h200:1,gpu:1g.18gb:2,shard:4``."""
    counts: Dict[str, int] = {}
    for gpu in node.get("gpus") or []:
        key = "gpu:%s" % gpu["type"] if gpu.get("type") else "gpu"
        counts[key] = counts.get(key, 0) + 1
    parts = ["%s:%d" % (key, count) for key, count in counts.items()]
    if node.get("shards"):
        parts.append("shard:%d" % int(node["shards"]))
    return ",".join(parts)


def slurm_conf_lines(req: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(key, value) pairs of slurm.conf's global part, in a stable order."""
    ctl = req["controller"]
    paths = req["paths"]
    host = ctl["host"] + ("(%s)" % ctl["address"] if ctl.get("address") else "")
    pairs = [
        ("ClusterName", req["cluster_name"]),
        ("SlurmctldHost", host),
        ("SlurmctldPort", str(req["slurmctld_port"])),
        ("SlurmdPort", str(req["slurmd_port"])),
        ("SlurmUser", req["slurm_user"]),
        ("AuthType", "auth/munge"),
        ("CryptoType", "crypto/munge"),
    ]
    if req.get("munge_socket"):
        pairs.append(("AuthInfo", "socket=%s" % req["munge_socket"]))
    pairs += [
        ("StateSaveLocation", paths["state_save"]),
        ("SlurmdSpoolDir", paths["spool"]),
        ("SlurmctldPidFile", paths["run"] + "/slurmctld.pid"),
        ("SlurmdPidFile", paths["run"] + "/slurmd.%n.pid"),
        ("SlurmctldLogFile", paths["log"] + "/slurmctld.log"),
        ("SlurmdLogFile", paths["log"] + "/slurmd.%n.log"),
        ("ProctrackType", "proctrack/%s" % req["proctrack"]),
        ("TaskPlugin", "task/cgroup,task/affinity" if req["proctrack"] == "cgroup" else "task/none"),
        ("JobAcctGatherType", "jobacct_gather/%s" % ("cgroup" if req["proctrack"] == "cgroup" else "linux")),
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_Core_Memory" if all(n.get("memory_mb") for n in req["nodes"]) else "CR_Core"),
        ("MpiDefault", "none"),
        ("ReturnToService", "2"),
    ]
    types = sorted({t for node in req["nodes"] for t in _gres_types(node)})
    if types:
        pairs.append(("GresTypes", ",".join(types)))
    acct = req.get("accounting")
    if acct:
        pairs += [("AccountingStorageType", "accounting_storage/slurmdbd"),
                  ("AccountingStorageHost", acct["host"]),
                  ("AccountingStoragePort", str(acct["port"]))]
        if req.get("munge_socket"):
            pairs.append(("AccountingStoragePass", req["munge_socket"]))
        pairs += [("AccountingStorageTRES", ",".join(["gres/%s" % t for t in types] or ["cpu"])),
                  ("AccountingStorageEnforce", "associations,limits,qos")]
    pairs.append(("JobCompType", "jobcomp/none"))
    pairs += sorted((k, str(v)) for k, v in (req.get("extra") or {}).items())
    return pairs


def render_slurm_conf(req: Dict[str, Any]) -> str:
    lines = [HEADER] + ["%s=%s\n" % pair for pair in slurm_conf_lines(req)]
    for node in req["nodes"]:
        fields = ["NodeName=%s" % node["name"], "NodeAddr=%s" % (node.get("address") or node["name"])]
        if node.get("cpus"):
            fields.append("CPUs=%d" % int(node["cpus"]))
        if node.get("memory_mb"):
            fields.append("RealMemory=%d" % int(node["memory_mb"]))
        gres = node_gres(node)
        if gres:
            fields.append("Gres=%s" % gres)
        if node.get("features"):
            fields.append("Features=%s" % ",".join(node["features"]))
        fields.append("State=UNKNOWN")
        lines.append(" ".join(fields) + "\n")
    for part in req["partitions"]:
        nodes = part.get("nodes") or [n["name"] for n in req["nodes"]]
        fields = ["PartitionName=%s" % part["name"], "Nodes=%s" % ",".join(nodes),
                  "Default=%s" % ("YES" if part.get("default") else "NO"),
                  "MaxTime=%s" % (part.get("max_time") or "INFINITE"), "State=UP"]
        lines.append(" ".join(fields) + "\n")
    return "".join(lines)


def render_gres_conf(req: Dict[str, Any]) -> str:
    """One line per GPU (File= names its device: Debian's Slurm has no NVML autodetection) or MIG
    device (MultipleFiles=), and one Count= line per node that shares its GPUs as shards."""
    lines = [HEADER]
    for node in req["nodes"]:
        for gpu in node.get("gpus") or []:
            fields = ["NodeName=%s" % node["name"], "Name=gpu"]
            if gpu.get("type"):
                fields.append("Type=%s" % gpu["type"])
            # A MIG device is its GPU's device file plus its two capability files, one GRES
            # (gres.conf(5) of Slurm 22.05, MultipleFiles; Slurm's own NVML autodetection builds
            # the same list in src/plugins/gpu/nvml/gpu_nvml.c, _handle_mig).
            if gpu.get("files") is not None:
                fields.append("MultipleFiles=%s" % ",".join(gpu["files"]))
            else:
                fields.append("File=%s" % gpu["file"])
            lines.append(" ".join(fields) + "\n")
        if node.get("shards"):
            lines.append("NodeName=%s Name=shard Count=%d\n" % (node["name"], int(node["shards"])))
    return "".join(lines)


def render_cgroup_conf(req: Dict[str, Any]) -> str:
    lines = [HEADER, "CgroupPlugin=%s\n" % req["cgroup_plugin"]]
    if req["proctrack"] == "cgroup":
        lines += ["ConstrainCores=yes\n", "ConstrainDevices=yes\n", "ConstrainRAMSpace=yes\n"]
    return "".join(lines)


def render_all(req: Dict[str, Any]) -> Dict[str, str]:
    return {"slurm.conf": render_slurm_conf(req), "gres.conf": render_gres_conf(req),
            "cgroup.conf": render_cgroup_conf(req)}


# -- what a change needs ----------------------------------------------------------------------
def _keys(text: Optional[str]) -> Dict[str, str]:
    """slurm.conf's global keys, and its node lines as one pseudo-key."""
    found: Dict[str, str] = {}
    nodes = []
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if key == "NodeName":
            nodes.append(line)
        elif key != "PartitionName":
            found[key] = value
    # A node added, removed or changed (its GRES, CPUs, memory) needs every daemon restarted.
    found["<nodes>"] = "\n".join(sorted(nodes))
    return found


def daemons_to_restart(before: Dict[str, Optional[str]], after: Dict[str, str]) -> Tuple[List[str], bool]:
    """(daemons to restart, whether ``scontrol reconfigure`` is enough for the rest)."""
    restart: List[str] = []
    changed = [name for name in after if before.get(name) != after[name]]
    if not changed:
        return [], False
    if "slurm.conf" in changed:
        old, new = _keys(before.get("slurm.conf")), _keys(after["slurm.conf"])
        moved = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
        if before.get("slurm.conf") is None or moved & (RESTART_KEYS | {"<nodes>"}):
            restart = ["slurmctld", "slurmd"]
    if any(name in changed for name in SLURMD_START_FILES) and "slurmd" not in restart:
        restart.append("slurmd")
    return restart, not restart
