# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_device_plugin_config's argument spec, runner and the two files it writes.

The configs themselves are data built in ``_device_plugin`` (pure functions); this file
decides which of the files (``dest``, ``mig_parted_dest``) differ from them and writes only
those, through ``tracker.act``, so check mode writes nothing and a write that fails after the
first one is reported as the partial change it is. ``PluginConfigFiles`` is the only code
here that touches the disk.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from ansible.module_utils.basic import missing_required_lib

from .._core._atomic_file import read_text, write_text_atomic
from .._core._errors import InvalidInputError
from .._core._runner import ObjectRunner
from ._device_plugin import (CONFIG_NAME, HAS_YAML, YAML_IMPORT_ERROR, advertised, helm_values, mig_parted_config,
                             plugin_config, profiles_from_option, to_yaml)
from ._mig import INSTANCE_SPEC

# Configs, not secrets: readable by all; a file with another mode is set back to this one.
FILE_MODE = 0o644


def argument_spec() -> Dict[str, Any]:
    resource = dict(
        name=dict(type="str", default="nvidia.com/gpu"),
        replicas=dict(type="int", required=True),
        devices=dict(type="raw", default="all"),
    )
    section = dict(
        rename_by_default=dict(type="bool", default=False),
        fail_requests_greater_than_one=dict(type="bool"),
        resources=dict(type="list", elements="dict", required=True, options=resource),
    )
    return dict(
        mig_strategy=dict(type="str", default="none", choices=["none", "single", "mixed"]),
        sharing=dict(type="dict", options=dict(time_slicing=dict(type="dict", options=section),
                                               mps=dict(type="dict", options=section))),
        flags=dict(type="dict", default={}),
        mig_configs=dict(type="list", elements="dict", options=dict(
            name=dict(type="str", required=True),
            devices=dict(type="raw", default="all"),
            mig_mode=dict(type="str", default="enabled", choices=["enabled", "disabled"]),
            instances=dict(type="list", elements="dict", options=INSTANCE_SPEC),
        )),
        mig_profiles=dict(type="list", elements="raw"),
        helm_config_name=dict(type="str", default="mlinfra"),
        dest=dict(type="path"),
        mig_parted_dest=dict(type="path"),
    )


def fail_without_yaml(module: Any) -> None:
    """Fail as soon as the AnsibleModule exists when PyYAML is missing: every config is YAML."""
    if not HAS_YAML:
        module.fail_json(msg=missing_required_lib("PyYAML"), exception=YAML_IMPORT_ERROR)


class PluginConfigFiles:
    """The service: reads, checks and writes the config files (the only I/O of this runner)."""

    read = staticmethod(read_text)  # the whole file, or None when it is absent

    @staticmethod
    def mode(path: str) -> int:
        return os.stat(path).st_mode & 0o777

    @staticmethod
    def is_directory(path: str) -> bool:
        return os.path.isdir(path)

    @staticmethod
    def write(path: str, content: str) -> None:
        """Replace the file whole (a temporary file renamed over it), with FILE_MODE."""
        write_text_atomic(path, content, FILE_MODE)


class DevicePluginConfigRunner(ObjectRunner):
    def __init__(self, module: Any, service: PluginConfigFiles) -> None:
        super().__init__(module, service)
        self.before: Dict[str, str] = {}
        self.after: Dict[str, str] = {}

    def validate(self) -> None:
        name = self.params["helm_config_name"]
        if not CONFIG_NAME.match(name or ""):
            raise InvalidInputError("helm_config_name", name, "is not a ConfigMap key the chart can select",
                                    "use 1-63 letters, digits, '.', '_' or '-', e.g. mlinfra")
        if self.params["mig_parted_dest"] and self.params["mig_configs"] is None:
            raise InvalidInputError("mig_parted_dest", self.params["mig_parted_dest"], "is set without mig_configs",
                                    "describe the geometry in mig_configs, or leave mig_parted_dest out")
        for option in ("dest", "mig_parted_dest"):
            path = self.params[option]
            if path and (self.service.is_directory(path) or not os.path.isabs(path)):
                raise InvalidInputError(option, path, "is a directory or not an absolute path",
                                        "give an absolute file path, e.g. /etc/mlinfra/nvidia-device-plugin.yaml")

    def converge(self) -> Dict[str, Any]:
        profiles = profiles_from_option(self.params["mig_profiles"])
        parted = mig_parted_config(self.params["mig_configs"], profiles)
        config = plugin_config(self.params["mig_strategy"], self.params["sharing"], self.params["flags"],
                               profiles, parted)
        config_yaml = to_yaml(config)
        parted_yaml = to_yaml(parted) if parted is not None else ""
        values = helm_values(self.params["helm_config_name"], config_yaml)
        self.file("dest", config_yaml)
        if parted is not None:
            self.file("mig_parted_dest", parted_yaml)
        result: Dict[str, Any] = {
            "changed": self.tracker.changed,
            "config": config,
            "config_yaml": config_yaml,
            "mig_parted": parted,
            "mig_parted_yaml": parted_yaml,
            "helm_values": values,
            "helm_values_yaml": to_yaml(values),
            "advertised": advertised(config),
        }
        if self.before or self.after:
            result["diff"] = {"before": self.before, "after": self.after}
        return result

    def file(self, option: str, content: str) -> None:
        """Write ``content`` to the path of ``option`` when it differs (or its mode does)."""
        path: Optional[str] = self.params[option]
        if not path:
            return
        current = self.service.read(path)
        mode_wrong = current is not None and self.service.mode(path) != FILE_MODE
        self.before[path] = current or ""
        self.after[path] = content
        if current == content and not mode_wrong:
            return
        self.tracker.act("write %s" % path if current != content else "set mode 0644 on %s" % path,
                         self.service.write, path, content)


def run_nvidia_device_plugin_config(module: Any) -> Dict[str, Any]:
    return DevicePluginConfigRunner(module, PluginConfigFiles()).run()
