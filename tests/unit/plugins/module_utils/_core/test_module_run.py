"""plugins/module_utils/_core/_module.run: how every module ends."""
from __future__ import annotations

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import run

pytestmark = pytest.mark.unit


class Ended(Exception):
    pass


class FakeModule:
    _name = "mlinfra.kvm.example"

    def __init__(self) -> None:
        self.failed = None

    def fail_json(self, **result):
        self.failed = result
        raise Ended()

    def exit_json(self, **result):
        raise AssertionError("exit_json called with %r" % result)


def test_a_bug_is_a_message_naming_the_module_not_a_traceback():
    module = FakeModule()

    def runner():
        return {}["missing"]

    with pytest.raises(Ended):
        run(module, runner)
    assert module.failed["msg"].startswith("internal error in mlinfra.kvm.example (a bug in mlinfra.kvm"), module.failed
    assert "KeyError: 'missing'" in module.failed["msg"]
    assert "Traceback" in module.failed["exception"]  # for -vvv, never in msg
    assert "Traceback" not in module.failed["msg"]


def test_a_refusal_keeps_its_option_and_changed_false():
    module = FakeModule()

    def runner():
        raise InvalidInputError("memory", "lots", "is not a size", "give 2G")

    with pytest.raises(Ended):
        run(module, runner)
    assert module.failed["option"] == "memory" and module.failed["changed"] is False


def test_a_raw_libvirt_error_is_libvirt_s_message_not_a_bug_report():
    import libvirt
    module = FakeModule()

    def runner():
        raise libvirt.libvirtError("Cannot recv data: Connection reset by peer")

    with pytest.raises(Ended):
        run(module, runner)
    assert module.failed["msg"].startswith("libvirt error: code "), module.failed
    assert "Cannot recv data" in module.failed["msg"] and "re-run to converge" in module.failed["msg"]
    assert "Traceback" not in module.failed["msg"]


@pytest.mark.parametrize("module, args, named", [
    ("domain", {"name": "x", "uri": "test:///default", "numa_tuning": 7}, "numa_tuning"),
    ("nvidia_device_plugin_config", {"sharing": {"time_slicing": 7}}, "sharing.time_slicing"),
    ("domain", {"name": "x", "uri": "test:///default", "disks": [3]}, "disks"),
    # ansible-core fails these itself, but with "dictionary requested, could not parse JSON or
    # key=value", naming no option.
    ("pools", {"uri": "test:///default", "config": "text"}, "option config[0]: value 'text' is not a mapping"),
    ("slurm_accounts", {"cluster": "lab", "accounts": ["ok-name", {"name": "x"}]}, "option accounts[0]:"),
])
def test_a_scalar_for_an_option_with_suboptions_is_refused_naming_it(module, args, named):
    """ansible-core's own validation raises a bare TypeError here; new_module turns it into a
    refusal naming the option, so no traceback reaches the user."""
    from conftest import run_module_process
    result = run_module_process(module, args, check=True)
    assert result["failed"] and named in result["msg"], result
    assert "Traceback" not in result.get("module_stderr", "") and "MODULE FAILURE" not in result["msg"]
