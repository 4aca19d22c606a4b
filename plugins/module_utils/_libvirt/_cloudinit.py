# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NoCloud seed content: render user-data / meta-data / network-config and hash them.

Pure functions (no I/O except :func:`read_iso_ids`), so the cloud_init module's decisions
can be unit-tested without genisoimage. The seed's content hash is written into the ISO's
application identifier (``-appid``): the ISO itself says what it holds, no sidecar file
can drift from it, and a re-run compares hashes instead of rebuilding (genisoimage output is
not byte-reproducible: it embeds timestamps).
"""
from __future__ import annotations

import hashlib
import re
from typing import Any, Dict, List, Optional, Tuple

from .._core._errors import InvalidInputError

try:
    import yaml  # type: ignore  # ansible-core depends on PyYAML
    HAS_YAML = True
except ImportError:  # pragma: no cover - depends on the host
    yaml = None  # type: ignore
    HAS_YAML = False

VOLUME_ID = "cidata"
APPID_PREFIX = "mlkvm-seed sha256:"
# Bumped when the rendering changes, so seeds built by an older renderer are rebuilt.
FORMAT_VERSION = "mlkvm-nocloud-v1"
# cloud-init uses instance-id as a directory name and compares it across boots.
_INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ISO_SECTOR = 2048


class _Dumper(yaml.SafeDumper if HAS_YAML else object):  # type: ignore[misc]
    """SafeDumper that writes multi-line strings (keys, scripts) as literal blocks."""


def _str_presenter(dumper: Any, data: str) -> Any:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


if HAS_YAML:
    _Dumper.add_representer(str, _str_presenter)


def to_yaml(data: Dict[str, Any]) -> str:
    # sort_keys: the same mapping always renders (and hashes) the same, whatever the
    # order Ansible's templating produced.
    return yaml.dump(data, Dumper=_Dumper, default_flow_style=False, sort_keys=True,
                     allow_unicode=True, width=4096)


def _plain(value: Any) -> Any:
    """Ansible hands templated values over as dict/list subclasses: make them plain."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


def _check_type(option: str, value: Any, secret: bool = False) -> None:
    if value is not None and not isinstance(value, (dict, str)):
        # user_data may carry secrets: name its type, never echo it.
        shown = "<%s, not shown>" % type(value).__name__ if secret else value
        raise InvalidInputError(option, shown, "is a %s, not a mapping or a string" % type(value).__name__,
                                "give a dict (rendered to YAML) or the file's text as a string")


def render_user_data(value: Any) -> str:
    """A dict becomes '#cloud-config' YAML; a string is used as it is (any cloud-init format)."""
    _check_type("user_data", value, secret=True)
    if value is None:
        return "#cloud-config\n{}\n"
    if isinstance(value, dict):
        return "#cloud-config\n" + to_yaml(_plain(value))
    if not value.strip():
        raise InvalidInputError("user_data", "<empty string>", "is empty",
                                "omit user_data (an empty #cloud-config is used) or give its content")
    return value


def render_meta_data(value: Any, instance_id: Optional[str], default_instance_id: str) -> Tuple[str, str]:
    """meta-data text and the instance-id it carries.

    ``instance_id`` (the option) wins over a dict's ``instance-id``; without either the
    default (derived from the content hash) is used, so changed content means a new instance
    to cloud-init and its per-instance modules run again.
    """
    _check_type("meta_data", value)
    if isinstance(value, str):
        if instance_id is not None:
            raise InvalidInputError("instance_id", instance_id, "cannot be merged into meta_data given as a string",
                                    "give meta_data as a dict, or put instance-id into the string")
        return value, instance_id_of("meta_data", value)
    data = _plain(value) if value else {}
    if instance_id is not None:
        data["instance-id"] = validate_instance_id("instance_id", instance_id)
    elif "instance-id" in data:
        data["instance-id"] = validate_instance_id("meta_data", data["instance-id"])
    else:
        data["instance-id"] = default_instance_id
    text = to_yaml(data)
    return text, instance_id_of("meta_data", text)


def instance_id_of(option: str, text: str) -> str:
    """The instance-id cloud-init will read from meta-data ``text``: the top-level key of the
    YAML mapping, parsed as cloud-init parses it (yaml.safe_load). What the module reports is
    read back from the text it writes, so it cannot differ from what the guest sees (a line
    match would take an indented key of a nested mapping, or the first of two keys where YAML
    keeps the last)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInputError(option, text, "is not YAML (%s)" % str(exc).replace("\n", " "),
                                "write meta-data as a YAML mapping, e.g. 'instance-id: vm1-v1'")
    if not isinstance(data, dict) or "instance-id" not in data:
        raise InvalidInputError(option, text, "has no top-level 'instance-id' key",
                                "add 'instance-id: <id>' at the top level (cloud-init needs it to tell "
                                "instances apart)")
    found = data["instance-id"]
    if not isinstance(found, str):
        raise InvalidInputError(option, found, "is the instance-id, but YAML reads it as a %s, not a string"
                                % type(found).__name__, "quote it: instance-id: '%s'" % found)
    return validate_instance_id(option, found)


def validate_instance_id(option: str, value: Any) -> str:
    if not isinstance(value, str) or not _INSTANCE_ID_RE.match(value):
        raise InvalidInputError(option, value, "is not a valid instance-id",
                                "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return value


def render_network_config(value: Any) -> Optional[str]:
    _check_type("network_config", value)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    data = _plain(value)
    body = data.get("network", data) if isinstance(data.get("network"), dict) else data
    if body.get("version") not in (1, 2):
        raise InvalidInputError("network_config", value, "has no 'version: 1' or 'version: 2'",
                                "write network config v1 or v2 (netplan style), e.g. "
                                "{version: 2, ethernets: {eth0: {dhcp4: true}}}")
    return to_yaml(data)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def content_hash(files: Dict[str, str]) -> str:
    """One hash over every file's name and bytes (length-prefixed: no ambiguity)."""
    digest = hashlib.sha256(FORMAT_VERSION.encode())
    for name in sorted(files):
        data = files[name].encode("utf-8")
        digest.update(b"\0%s\0%d\0" % (name.encode(), len(data)))
        digest.update(data)
    return digest.hexdigest()


def render_seed(user_data: Any, meta_data: Any, network_config: Any,
                instance_id: Optional[str]) -> Tuple[Dict[str, str], str]:
    """The seed's files {name: text} and its instance-id."""
    files = {"user-data": render_user_data(user_data)}
    network = render_network_config(network_config)
    if network is not None:
        files["network-config"] = network
    # The default instance-id hashes what is rendered so far (user-data, network-config).
    default_iid = "iid-" + content_hash(files)[:16]
    files["meta-data"], iid = render_meta_data(meta_data, instance_id, default_iid)
    return files, iid


def appid_for(digest: str) -> str:
    return APPID_PREFIX + digest


def digest_from_appid(appid: Optional[str]) -> Optional[str]:
    if appid and appid.startswith(APPID_PREFIX):
        return appid[len(APPID_PREFIX):]
    return None


def read_iso_ids(path: str) -> Optional[Dict[str, str]]:
    """Volume and application identifiers of an ISO 9660 image; None if it is not one.

    Reads only the primary volume descriptor (sector 16), the cheapest way to learn what a
    seed holds without isoinfo or mounting it.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(16 * _ISO_SECTOR)
            pvd = handle.read(_ISO_SECTOR)
    except OSError:
        return None
    if len(pvd) < _ISO_SECTOR or pvd[0:1] != b"\x01" or pvd[1:6] != b"CD001":
        return None
    return {
        "volume_id": pvd[40:72].decode("ascii", "replace").rstrip(),
        "application_id": pvd[574:702].decode("ascii", "replace").rstrip(),
    }


def summary(files: Dict[str, str]) -> List[Dict[str, Any]]:
    """What may be shown of the files: names, sizes and hashes, never user-data's text."""
    return [{"name": name, "size": len(files[name].encode("utf-8")), "sha256": sha256_text(files[name])}
            for name in sorted(files)]
