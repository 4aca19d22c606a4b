# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA Kubernetes device plugin's config file and mig-parted's config, as data.

Pure functions: options in, plain dicts out, YAML only through ``yaml`` dumpers. The rules
are the plugin's own (NVIDIA/k8s-device-plugin, api/config/v1 and cmd/nvidia-device-plugin,
v0.15-v0.20) plus the cases its lenient parser accepts and then ignores (a misplaced key is
dropped without a word, issue #1433; ``devices`` and ``rename`` in sharing resources are
"not yet supported ... Ignoring"): those are refused here, so that what is written is what
the plugin does. mig-parted's parser is strict (api/spec/v1); its rules are mirrored too.
"""
from __future__ import annotations

import re
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

try:
    import yaml
except ImportError:  # the module fails with missing_required_lib (see YAML_IMPORT_ERROR)
    HAS_YAML = False
    YAML_IMPORT_ERROR: Optional[str] = traceback.format_exc()
else:
    HAS_YAML = True
    YAML_IMPORT_ERROR = None

from .._core._errors import InvalidInputError
from ._mig import Profile, counted, describe_profiles, expand_request, lookup_profile, validate_request

VERSION = "v1"
RESOURCE_PREFIX = "nvidia.com"
SHARED_SUFFIX = ".shared"
GI_PROFILE_NAME = re.compile(r"^\d+g\.\d+gb(\+[a-z]+)?$")
MIG_RESOURCE = re.compile(r"^mig-(\d+g\.\d+gb(?:\+[a-z]+)?)$")
CONFIG_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")

# flags.* of the plugin's config (api/config/v1/flags.go): key -> type, or a nested table.
FLAG_SCHEMA: Dict[str, Any] = {
    "failOnInitError": bool, "mpsRoot": str, "nvidiaDriverRoot": str, "nvidiaDevRoot": str,
    "gdrcopyEnabled": bool, "gdsEnabled": bool, "mofedEnabled": bool, "useNodeFeatureAPI": bool,
    "deviceDiscoveryStrategy": ("auto", "nvml", "tegra"),
    "plugin": {"passDeviceSpecs": bool, "deviceListStrategy": (str, list), "deviceIDStrategy": ("uuid", "index"),
               "cdiAnnotationPrefix": str, "nvidiaCTKPath": str, "containerDriverRoot": str,
               "sharedDevicesAllocationPolicy": ("distributed", "packed")},
    "gfd": {"oneshot": bool, "noTimestamp": bool, "sleepInterval": str, "outputFile": str, "machineTypeFile": str},
}
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
# Keys people put under flags that the plugin reads elsewhere (and ignores silently under flags).
MISPLACED = {
    "migStrategy": "set the module option mig_strategy",
    "renameByDefault": "set sharing.time_slicing.rename_by_default or sharing.mps.rename_by_default",
    "failRequestsGreaterThanOne": "set sharing.<time_slicing|mps>.fail_requests_greater_than_one",
    "resources": "list the shared resources under sharing.<time_slicing|mps>.resources",
    "replicas": "give replicas per resource under sharing.<time_slicing|mps>.resources",
    "timeSlicing": "use the option sharing.time_slicing", "mps": "use the option sharing.mps",
    "sharing": "use the option sharing",
}
SECTIONS = (("time_slicing", "timeSlicing"), ("mps", "mps"))


# -- the profile table --------------------------------------------------------------------------------

def profiles_from_option(value: Optional[Sequence[Any]]) -> Optional[List[Profile]]:
    """``mig_profiles`` (nvidia_mig's ``profiles`` return, or names) -> Profiles; None when absent.

    Entries without placements get none (name and count checks only, no fit check).
    """
    if value is None:
        return None
    out = []
    for number, item in enumerate(value):
        option = "mig_profiles[%d]" % number
        item = {"name": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
            raise InvalidInputError(option, item, "has no profile name",
                                    "give nvidia_mig's profiles return value, or names such as 3g.71gb")
        name = item["name"].strip()
        name = name[4:].strip() if name.upper().startswith("MIG ") else name
        if not GI_PROFILE_NAME.match(name):
            raise InvalidInputError(option + ".name", item["name"], "is not a GPU-instance profile name",
                                    "write it as nvidia-smi mig -lgip does, e.g. 3g.71gb")
        starts = item.get("placement_starts") or []
        size = item.get("placement_size") or 0
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in starts) \
                or not isinstance(size, int) or size < 0:
            raise InvalidInputError(option, item, "has placements that are not lists of slice numbers",
                                    "give placement_starts: [0, 4] and placement_size: 4 (nvidia_mig's profiles)")
        out.append(Profile(int(item.get("id", -1 - number)), name, int(item.get("total") or 0),
                           int(item.get("free") or 0), float(item.get("memory_gib") or 0),
                           tuple(starts), int(size)))
    if not out:
        raise InvalidInputError("mig_profiles", value, "is empty", "leave it out, or give the GPU's profiles")
    return out


def has_placements(profiles: Sequence[Profile]) -> bool:
    return all(p.starts and p.size for p in profiles)


def has_totals(profiles: Sequence[Profile]) -> bool:
    return all(p.total > 0 for p in profiles)


def check_profile_name(option: str, value: Any, profiles: Optional[Sequence[Profile]]) -> str:
    if profiles is not None:
        return lookup_profile(option, value, profiles, "the GPU of mig_profiles").name
    name = str(value or "").strip()
    name = name[4:].strip() if name.upper().startswith("MIG ") else name
    if not GI_PROFILE_NAME.match(name):
        raise InvalidInputError(option, value, "is not a GPU-instance profile name",
                                "write it as nvidia-smi mig -lgip lists it, e.g. 3g.71gb (give mig_profiles to "
                                "check it against a GPU's table)")
    return name


# -- mig-parted ---------------------------------------------------------------------------------------

def _devices(option: str, value: Any) -> Any:
    if value == "all":
        return "all"
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in value):
        if len(set(value)) != len(value):
            raise InvalidInputError(option, value, "names a GPU twice", "list each GPU index once")
        return sorted(value)
    raise InvalidInputError(option, value, "is neither 'all' nor a list of GPU indices",
                            "write all, or e.g. [0, 1] (mig-parted accepts nothing else)")


def _mig_devices(option: str, instances: Optional[Sequence[Dict[str, Any]]],
                 profiles: Optional[Sequence[Profile]]) -> Dict[str, int]:
    if not instances:
        return {}
    if profiles is not None and has_totals(profiles):
        wanted = expand_request(option, instances, profiles, "the GPU of mig_profiles")
        if has_placements(profiles):
            validate_request(option, instances, wanted, profiles, "the GPU of mig_profiles")
        else:
            for name, count in counted(p.name for p in wanted):
                total = next(p.total for p in profiles if p.name == name)
                if count > total:
                    raise InvalidInputError(option, instances, "asks for %d x %s, the GPU allows %d" % (count, name, total),
                                            "ask for at most %d; profiles: %s" % (total, describe_profiles(profiles)))
        return dict(counted(p.name for p in wanted))
    out: Dict[str, int] = {}
    for number, item in enumerate(instances):
        name = check_profile_name("%s[%d].profile" % (option, number), item.get("profile"), profiles)
        count = item.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidInputError("%s[%d].count" % (option, number), count, "is not a positive integer",
                                    "give 1 or more")
        out[name] = out.get(name, 0) + count
    return out


def mig_parted_config(mig_configs: Optional[Sequence[Dict[str, Any]]],
                      profiles: Optional[Sequence[Profile]]) -> Optional[Dict[str, Any]]:
    """``version: v1`` + ``mig-configs`` (entries that share a name form one config)."""
    if mig_configs is None:
        return None
    if not mig_configs:
        raise InvalidInputError("mig_configs", mig_configs, "is empty; mig-parted needs at least one entry",
                                "leave mig_configs out, or describe a geometry")
    configs: Dict[str, List[Dict[str, Any]]] = {}
    taken: Dict[str, List[Any]] = {}
    for number, entry in enumerate(mig_configs):
        option = "mig_configs[%d]" % number
        name = entry.get("name")
        if not isinstance(name, str) or not CONFIG_NAME.match(name):
            raise InvalidInputError(option + ".name", name, "is not a usable config name",
                                    "use 1-63 letters, digits, '.', '_' or '-' (it becomes the node label "
                                    "nvidia.com/mig.config), e.g. h200-3g-2g-2x1g")
        devices = _devices(option + ".devices", entry.get("devices", "all"))
        earlier = taken.setdefault(name, [])
        if devices == "all" and earlier or "all" in earlier or \
                (devices != "all" and set(devices) & {i for d in earlier for i in d}):
            raise InvalidInputError(option + ".devices", devices, "overlaps another entry of config %s" % name,
                                    "give each GPU of a config one entry ('all' only alone)")
        earlier.append(devices)
        enabled = entry.get("mig_mode", "enabled") == "enabled"
        if not enabled and entry.get("instances"):
            raise InvalidInputError(option + ".instances", entry["instances"], "is set while mig_mode is disabled",
                                    "remove instances, or set mig_mode: enabled")
        item: Dict[str, Any] = {"devices": devices, "mig-enabled": enabled}
        if enabled:
            item["mig-devices"] = _mig_devices(option + ".instances", entry.get("instances"), profiles)
        configs.setdefault(name, []).append(item)
    return {"version": VERSION, "mig-configs": configs}


def mig_layouts(parted: Optional[Dict[str, Any]]) -> List[Tuple[str, Dict[str, Any]]]:
    if not parted:
        return []
    return [(name, item) for name, items in parted["mig-configs"].items() for item in items]


# -- the device plugin -----------------------------------------------------------------------------

def check_flags(flags: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Plugin flags besides migStrategy: known keys with values of the right type only."""
    if not flags:
        return {}
    return _check_table("flags", flags, FLAG_SCHEMA)


def _check_table(path: str, table: Dict[str, Any], schema: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in table.items():
        option = "%s.%s" % (path, key)
        if key in MISPLACED and key not in schema:
            raise InvalidInputError(option, value, "is not read under %s: the plugin ignores it there without a "
                                    "word (NVIDIA/k8s-device-plugin#1433)" % path, MISPLACED[key])
        if key not in schema:
            raise InvalidInputError(option, value, "is not a key the plugin reads under %s (it would ignore it)" % path,
                                    "use one of: %s" % ", ".join(sorted(schema)))
        kind = schema[key]
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                raise InvalidInputError(option, value, "is not a mapping", "give its keys: %s" % ", ".join(sorted(kind)))
            out[key] = _check_table(option, value, kind)
        else:
            out[key] = _check_value(option, value, kind)
    return out


def _check_value(option: str, value: Any, kind: Any) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise InvalidInputError(option, value, "is not a boolean", "write true or false")
        return value
    if kind is str:
        if not isinstance(value, str) or not value:
            raise InvalidInputError(option, value, "is not a non-empty string", "give a string")
        return value
    if kind == (str, list):  # deviceListStrategy: one strategy or a list of them
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or any(i not in DEVICE_LIST_STRATEGIES for i in items):
            raise InvalidInputError(option, value, "is not a device list strategy (or a list of them)",
                                    "use %s" % ", ".join(DEVICE_LIST_STRATEGIES))
        return value
    if value not in kind:
        raise InvalidInputError(option, value, "is not one of the values the plugin accepts", "use %s" % ", ".join(kind))
    return value


def resource_name(option: str, value: Any) -> str:
    """'gpu' and 'nvidia.com/gpu' are one resource (the plugin adds the prefix itself)."""
    text = str(value or "").strip()
    prefix, _unused, name = text.rpartition("/")
    if prefix and prefix != RESOURCE_PREFIX:
        raise InvalidInputError(option, value, "is not an nvidia.com resource", "use nvidia.com/gpu or nvidia.com/mig-<profile>")
    if name != "gpu" and not MIG_RESOURCE.match(name):
        raise InvalidInputError(option, value, "is not a resource the plugin advertises",
                                "use nvidia.com/gpu, or nvidia.com/mig-<profile> (mig_strategy mixed)")
    return "%s/%s" % (RESOURCE_PREFIX, name)


def sharing_section(key: str, section: Dict[str, Any], mig_strategy: str,
                    profiles: Optional[Sequence[Profile]]) -> Dict[str, Any]:
    """One of sharing.timeSlicing / sharing.mps, after the plugin's rules."""
    option = "sharing.%s" % key
    resources = section.get("resources") or []
    if not resources:
        raise InvalidInputError(option + ".resources", resources, "is empty; the plugin refuses a sharing section "
                                "without resources ('no resources specified')", "list e.g. {name: nvidia.com/gpu, replicas: 4}")
    fail_default = key == "mps"  # the plugin's own defaults: true for MPS, false for time-slicing
    fail = section.get("fail_requests_greater_than_one")
    out: Dict[str, Any] = {"renameByDefault": bool(section.get("rename_by_default")),
                           "failRequestsGreaterThanOne": fail_default if fail is None else bool(fail),
                           "resources": []}
    seen = set()
    for number, item in enumerate(resources):
        where = "%s.resources[%d]" % (option, number)
        name = resource_name(where + ".name", item.get("name", "nvidia.com/gpu"))
        if name in seen:
            raise InvalidInputError(where + ".name", name, "is listed twice", "give each resource once")
        seen.add(name)
        mig = MIG_RESOURCE.match(name.split("/", 1)[1])
        if key == "mps" and mig:
            raise InvalidInputError(where + ".name", name, "is a MIG device; MPS shares only whole GPUs "
                                    "(nvidia.com/gpu) in the plugin", "use nvidia.com/gpu, or time_slicing for MIG devices")
        if mig and mig_strategy != "mixed":
            raise InvalidInputError(where + ".name", name, "is only advertised with mig_strategy mixed (now %s)"
                                    % mig_strategy, "set mig_strategy: mixed, or share nvidia.com/gpu")
        if mig and profiles is not None:
            lookup_profile(where + ".name", mig.group(1), profiles, "the GPU of mig_profiles")
        replicas = item.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
            raise InvalidInputError(where + ".replicas", replicas, "is below 2; the plugin refuses it ('number of "
                                    "replicas must be >= 2')", "give 2 or more, or leave the resource out (not shared)")
        devices = item.get("devices", "all")
        if devices != "all":
            raise InvalidInputError(where + ".devices", devices, "selects devices, which the plugin ignores "
                                    "(\"Customizing the 'devices' field ... is not yet supported\"): every device "
                                    "of the resource is shared", "leave devices out (or write all)")
        out["resources"].append({"name": name, "devices": "all", "replicas": replicas})
    return out


def plugin_config(mig_strategy: str, sharing: Optional[Dict[str, Any]], flags: Optional[Dict[str, Any]],
                  profiles: Optional[Sequence[Profile]], parted: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    config: Dict[str, Any] = {"version": VERSION, "flags": {"migStrategy": mig_strategy}}
    config["flags"].update(check_flags(flags))
    given = [(key, plugin_key) for key, plugin_key in SECTIONS if (sharing or {}).get(key) is not None]
    if len(given) > 1:
        raise InvalidInputError("sharing", sharing, "sets both time_slicing and mps; the plugin uses one sharing "
                                "mechanism per node (MPS wins, time-slicing is silently dropped)",
                                "keep one of sharing.time_slicing and sharing.mps")
    if given:
        key, plugin_key = given[0]
        if key == "mps":
            check_mps(mig_strategy, parted)
        config["sharing"] = {plugin_key: sharing_section(key, sharing[key], mig_strategy, profiles)}
    check_strategy_against_layouts(mig_strategy, parted)
    return config


def check_mps(mig_strategy: str, parted: Optional[Dict[str, Any]]) -> None:
    if mig_strategy == "mixed":
        raise InvalidInputError("mig_strategy", mig_strategy, "is not allowed with sharing.mps (the plugin exits: "
                                "'using --mig-strategy=mixed is not supported with MPS')",
                                "use mig_strategy: none with MPS, or time_slicing with MIG")
    if mig_strategy == "single":
        raise InvalidInputError("mig_strategy", mig_strategy, "means every GPU is MIG-enabled, and MIG-enabled GPUs "
                                "are not MPS-capable in the plugin", "use mig_strategy: none with MPS")
    enabled = [name for name, item in mig_layouts(parted) if item["mig-enabled"]]
    if enabled:
        raise InvalidInputError("sharing.mps", "mps", "is set while mig_configs %s enable MIG; the plugin does not "
                                "share MIG-enabled GPUs with MPS" % sorted(set(enabled)),
                                "use time_slicing, or mig_mode: disabled in mig_configs")


def check_strategy_against_layouts(mig_strategy: str, parted: Optional[Dict[str, Any]]) -> None:
    """The MIG strategy must expose what mig_configs creates (NVIDIA's strategy rules)."""
    for name, items in (parted or {}).get("mig-configs", {}).items():
        enabled = [item for item in items if item["mig-enabled"]]
        if mig_strategy == "none" and enabled:
            raise InvalidInputError("mig_strategy", mig_strategy, "exposes no MIG device, and mig_configs %s enables "
                                    "MIG" % name, "use mig_strategy single or mixed")
        if mig_strategy == "single" and enabled:
            profiles = {profile for item in enabled for profile in item["mig-devices"]}
            if len(enabled) != len(items) or len(profiles) != 1 or any(not i["mig-devices"] for i in enabled):
                raise InvalidInputError("mig_strategy", mig_strategy, "needs every GPU MIG-enabled with instances of "
                                        "one profile, and mig_configs %s has %s" % (name, items),
                                        "use mig_strategy: mixed, or one profile on every GPU")


def advertised(config: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for section in config.get("sharing", {}).values():
        for item in section["resources"]:
            suffix = SHARED_SUFFIX if section["renameByDefault"] else ""
            out.append({"resource": item["name"] + suffix, "replicas_per_device": item["replicas"]})
    return out


# -- YAML ---------------------------------------------------------------------------------------------

def _str(dumper: Any, data: str) -> Any:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


if HAS_YAML:
    class _BlockDumper(yaml.SafeDumper):
        """SafeDumper that writes multi-line strings as literal blocks (the Helm values' config.map)."""

    _BlockDumper.add_representer(str, _str)


def to_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def helm_values(config_name: str, config_yaml: str) -> Dict[str, Any]:
    """Values for the nvidia-device-plugin chart: the config as config.map, made the default."""
    return {"config": {"map": {config_name: config_yaml}, "default": config_name}}
