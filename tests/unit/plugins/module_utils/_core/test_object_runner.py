"""plugins/module_utils/_core/_runner.ObjectRunner and the ledger of _core/_diff.DifferenceTracker:
the one run sequence of pool, network, volume, snapshot and domain, and how it reports a
failure that comes after a side effect (a partial change) for all five alike."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import libvirt
import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._diff import DifferenceTracker
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import (
    InvalidInputError, KvmError, LibvirtCallError)
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._runner import ObjectRunner

pytestmark = pytest.mark.unit


class FakeModule:
    def __init__(self, check_mode: bool = False, diff: bool = False) -> None:
        self.params: Dict[str, Any] = {}
        self.check_mode = check_mode
        self._diff = diff


class Recorder:
    """A service whose calls are recorded; ``fail`` names the call that raises and how."""

    def __init__(self, fail: Dict[str, Callable[[], BaseException]]) -> None:
        self.calls: List[str] = []
        self.fail = fail

    def __getattr__(self, name: str) -> Callable[..., str]:
        def call(*_args: Any) -> str:
            if name in self.fail:
                raise self.fail[name]()
            self.calls.append(name)
            return name
        return call


class Steps(ObjectRunner):
    """A runner that performs ``steps`` in turn, each through tracker.act."""

    def __init__(self, module: FakeModule, service: Recorder, steps: List[str], refuse: bool = False) -> None:
        super().__init__(module, service)
        self.steps = steps
        self.refuse = refuse
        self.validated = False

    def validate(self) -> None:
        if self.refuse:
            raise InvalidInputError("size", -1, "is negative", "give a size of 0 or more")
        self.validated = True

    def converge(self) -> Dict[str, Any]:
        for step in self.steps:
            self.tracker.act(step, getattr(self.service, step))
        return {"changed": self.tracker.changed, "actions": self.tracker.actions}


def libvirt_failure() -> BaseException:
    return LibvirtCallError("starting x", 1, "boom")


def test_a_run_without_failure_returns_converge_s_report():
    service = Recorder({})
    result = Steps(FakeModule(), service, ["define", "start"]).run()
    assert result == {"changed": True, "actions": ["define", "start"]}
    assert service.calls == ["define", "start"]


def test_bad_input_is_refused_before_converge_touches_anything():
    service = Recorder({})
    runner = Steps(FakeModule(), service, ["define"], refuse=True)
    with pytest.raises(InvalidInputError) as caught:
        runner.run()
    assert service.calls == [] and "changed" not in caught.value.details
    assert caught.value.msg == "option size: value -1 is negative; give a size of 0 or more"


def test_a_failure_after_a_side_effect_reports_what_was_done_and_what_failed():
    service = Recorder({"start": libvirt_failure})
    with pytest.raises(KvmError) as caught:
        Steps(FakeModule(), service, ["define", "start", "autostart"]).run()
    err = caught.value
    assert service.calls == ["define"]
    assert err.details["changed"] is True
    assert err.details["actions"] == ["define"] and err.details["failed_action"] == "start"
    assert err.msg == "libvirt error while starting x: code 1: boom (already done: define)"


def test_a_failure_at_the_first_side_effect_changed_nothing():
    with pytest.raises(KvmError) as caught:
        Steps(FakeModule(), Recorder({"define": libvirt_failure}), ["define", "start"]).run()
    assert "changed" not in caught.value.details and "already done" not in caught.value.msg


def test_check_mode_performs_nothing_so_reports_no_partial_change():
    class RefusesLate(Steps):
        def converge(self) -> Dict[str, Any]:
            super().converge()
            raise KvmError("refused after planning")

    service = Recorder({})
    with pytest.raises(KvmError) as caught:
        RefusesLate(FakeModule(check_mode=True), service, ["define", "start"]).run()
    assert service.calls == [] and "changed" not in caught.value.details
    assert caught.value.msg == "refused after planning"


def test_an_error_that_describes_its_own_actions_is_left_as_it_is():
    def rolled_back() -> BaseException:
        return KvmError("restored the previous definition", changed=True, actions=["stop", "start (failed)"])

    with pytest.raises(KvmError) as caught:
        Steps(FakeModule(), Recorder({"restart": rolled_back}), ["define", "restart"]).run()
    assert caught.value.details["actions"] == ["stop", "start (failed)"]
    assert caught.value.msg == "restored the previous definition"


def test_a_raw_libvirt_error_after_a_side_effect_becomes_a_partial_report():
    """libvirt raised outside a service's call() (libvirtd gone mid-run): its own words, the
    action it broke and what was already done; never a traceback."""
    service = Recorder({"start": lambda: libvirt.libvirtError("Cannot recv data: Connection reset by peer")})
    with pytest.raises(LibvirtCallError) as caught:
        Steps(FakeModule(), service, ["define", "start"]).run()
    err = caught.value
    assert err.details["changed"] is True and err.details["actions"] == ["define"]
    assert err.details["failed_action"] == "start"
    assert "Connection reset by peer" in err.msg and err.msg.endswith("(already done: define)")


def test_a_raw_libvirt_error_before_any_side_effect_is_left_to_the_module_s_handler():
    service = Recorder({"define": lambda: libvirt.libvirtError("no connection")})
    with pytest.raises(libvirt.libvirtError):
        Steps(FakeModule(), service, ["define"]).run()


def test_a_bug_is_not_turned_into_a_libvirt_error():
    service = Recorder({"start": lambda: KeyError("missing")})
    with pytest.raises(KeyError):
        Steps(FakeModule(), service, ["define", "start"]).run()


# -- the tracker's ledger -----------------------------------------------------------------------

def test_the_ledger_names_the_innermost_failing_action_and_keeps_the_outer_one_unperformed():
    """A start that clears leftovers and starts again (network) is an act around acts."""
    tracker = DifferenceTracker(check_mode=False)

    def start_clearing() -> None:
        tracker.act("stop dnsmasq 42", lambda: None)
        tracker.act("start again", libvirt_failure_raiser)

    def libvirt_failure_raiser() -> None:
        raise libvirt_failure()

    tracker.act("define", lambda: "net")
    with pytest.raises(LibvirtCallError):
        tracker.act("start", start_clearing)
    assert tracker.actions == ["define", "start", "stop dnsmasq 42", "start again"]
    assert tracker.performed == ["define", "stop dnsmasq 42"]
    assert tracker.failed_action == "start again"


def test_the_ledger_in_check_mode_records_actions_and_performs_none():
    tracker = DifferenceTracker(check_mode=True)
    assert tracker.act("define", lambda: pytest.fail("check mode ran a side effect")) is None
    assert tracker.actions == ["define"] and tracker.performed == [] and tracker.failed_action is None
