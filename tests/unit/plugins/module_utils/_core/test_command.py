"""run_bounded: every external command the collection runs has a time bound."""
from __future__ import annotations

import os
import time

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._command import (
    CommandNotFoundError, CommandTimeoutError, module_runner, run_bounded)

pytestmark = pytest.mark.unit


def test_output_and_status_come_back():
    assert run_bounded(["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, "out\n", "err\n")


def test_input_reaches_the_command():
    assert run_bounded(["cat"], data="hello")[1] == "hello"


def test_a_command_past_its_bound_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    start = time.monotonic()
    with pytest.raises(CommandTimeoutError) as info:
        run_bounded(["sh", "-c", "sleep 60 & echo $! > %s; wait" % pidfile], timeout_s=1)
    assert time.monotonic() - start < 15
    assert "within 1 s" in info.value.msg
    child = int(pidfile.read_text())
    for _attempt in range(50):  # the group was SIGKILLed; the grandchild is reaped by init
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the sleeping grandchild %d survived the bound" % child)


def test_a_missing_binary_is_named():
    with pytest.raises(CommandNotFoundError) as info:
        run_bounded(["/nonexistent/update-grub"])
    assert "/nonexistent/update-grub" in info.value.msg


def test_module_runner_keeps_run_commands_shape():
    run = module_runner(timeout_s=5)
    assert run(["printenv", "X"], environ_update={"X": "1"}) == (0, "1\n", "")
