"""Write the `config` suboptions of the resource-list modules (networks, pools, volumes, domains)
from the docs of their single-object modules (network, pool, volume, domain), so that an option is documented
once. tests/unit/plugins/module_utils/_libvirt/test_resource_list.py fails when the two drift apart; run this after changing
a single-object module's options:

    .venv/bin/python scripts/gen_list_module_docs.py
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / "plugins" / "modules"
KINDS = {"networks": ("network", ("name",), ["active", "present"]),
         "pools": ("pool", ("name",), ["active", "present"]),
         "volumes": ("volume", ("pool", "name"), ["present"]),
         "domains": ("domain", ("name",), ["present", "running", "paused", "shutdown", "destroyed"])}
STATE_LINES = {
    ("active", "present"): "V(active) defines and starts the object, V(present) defines it without changing whether it runs.",
    ("present", "running", "paused", "shutdown", "destroyed"):
        "V(present) defines the domain without changing whether it runs; V(running), V(paused), V(shutdown) and "
        "V(destroyed) also bring it to that run state, as M(mlinfra.kvm.domain) does.",
}
BEGIN, END = "    # BEGIN generated config suboptions\n", "    # END generated config suboptions\n"


def single_options(single: str) -> dict:
    text = (MODULES / (single + ".py")).read_text()
    doc = re.search(r"DOCUMENTATION = r'''\n(.*?)'''", text, re.S).group(1)
    return yaml.safe_load(doc)["options"]


def item_options(single: str, keys: tuple, states: list) -> dict:
    out = {}
    names = set(single_options(single)) - {"uri"}
    for option, desc in single_options(single).items():
        desc = dict(desc)
        default = desc.pop("default", None)
        desc.pop("required", None)
        lines = desc["description"] if isinstance(desc["description"], list) else [desc["description"]]
        lines = [relink(line, single, names) for line in lines]
        if option == "state":
            desc["choices"] = states + ["absent"]
            lines = ([STATE_LINES[tuple(states)]] if tuple(states) in STATE_LINES else []) + [
                "V(absent) removes it, with the same guards as M(mlinfra.kvm.%s), whatever the list's O(state) "
                "(with O(state=deleted) every listed object is removed)." % single]
        if default not in (None, [], False) or (default is False and option not in ("force",)):
            lines = lines + ["When the item does not set it: V(%s) (replaced, overridden, and a new object in merged; "
                             "merged keeps an existing object's value)." % (str(default).lower() if isinstance(default, bool) else default)]
        desc["description"] = lines
        if "suboptions" in desc:
            desc["suboptions"] = relink_suboptions(desc["suboptions"], single, names)
        if option in keys:
            desc["required"] = True
        out[option] = desc
    return out


def relink_suboptions(suboptions: dict, single: str, names: set) -> dict:
    out = {}
    for option, desc in suboptions.items():
        desc = dict(desc)
        lines = desc["description"] if isinstance(desc["description"], list) else [desc["description"]]
        desc["description"] = [relink(line, single, names) for line in lines]
        if "suboptions" in desc:
            desc["suboptions"] = relink_suboptions(desc["suboptions"], single, names)
        out[option] = desc
    return out


def relink(text: str, single: str, options: dict) -> str:
    """Markup that named the single module's options and return values, relinked for an item:
    O(x) -> O(config[].x), RV(x) -> RV(mlinfra.kvm.single#module:x)."""
    def option(match: "re.Match") -> str:
        name = match.group(1).split("=", 1)[0].split(".", 1)[0].split("[", 1)[0]
        return "O(config[].%s)" % match.group(1) if name in options else match.group(0)
    text = re.sub(r"O\(([a-z_][a-z_0-9.\[\]]*(?:=[^)]*)?)\)", option, text)
    return re.sub(r"RV\(([a-z_][^)#]*)\)", r"RV(mlinfra.kvm.%s#module:\1)" % single, text)


def render(options: dict) -> str:
    body = yaml.safe_dump({"suboptions": options}, sort_keys=False, width=100, default_flow_style=False)
    return "".join("    " + line + "\n" for line in body.splitlines())


def main() -> int:
    stale = []
    for module, (single, keys, states) in KINDS.items():
        path = MODULES / (module + ".py")
        text = path.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        new = text[:start] + render(item_options(single, keys, states)) + text[end:]
        if new != text:
            stale.append(module)
            if "--check" not in sys.argv:
                path.write_text(new)
    if stale and "--check" in sys.argv:
        print("stale config suboptions in: %s (run scripts/gen_list_module_docs.py)" % ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
