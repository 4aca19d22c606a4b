"""What mlflow.reuse trusts (issue 13): signed locks, pinned outs, collision-resistant hashes.

The signature helpers are tested directly; the option rules through the real module process
(each refusal names the option and the fix, runs nothing and leaves the lock as it was).
The round trip through a real MLflow server is in tests/integration/test_ml_stage_mlflow.py.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import COLLECTIONS
from test_ml_stage import _project, args, lock_bytes, ml, ok, runs

sys.path.insert(0, str(COLLECTIONS))
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _stage_sign as S  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_hash import choose_algorithm  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _stage_mlflow as M  # noqa: E402

pytestmark = pytest.mark.unit

KEY = "a site secret of 32 characters!!"
LOCK = b'{\n "key": "k1",\n "outs": {"model": {"hash": "aa", "kind": "dir"}}\n}\n'


def test_a_lock_signed_with_the_key_verifies() -> None:
    S.verify_signature(KEY, LOCK, S.signature(KEY, LOCK))   # no exception


@pytest.mark.parametrize("tamper, reason", [
    (lambda body, sig: (body.replace(b'"aa"', b'"bb"'), sig), "changed after it was signed"),
    (lambda body, sig: (body, S.signature("another site's secret key", body)),
     "signed with another key"),
    (lambda body, sig: (body, sig.replace(b"hmac-sha256", b"hmac-md5")), "is not hmac-sha256"),
    (lambda body, sig: (body, b"not json"), "is not JSON"),
    (lambda body, sig: (body, json.dumps({"algorithm": "hmac-sha256", "key_id": S.key_id(KEY)})
                        .encode()), "does not match its signature"),
])
def test_a_changed_lock_or_a_foreign_signature_is_refused(tamper: Any, reason: str) -> None:
    body, sig = tamper(LOCK, S.signature(KEY, LOCK))
    with pytest.raises(S.UntrustedLock) as info:
        S.verify_signature(KEY, body, sig)
    assert reason in str(info.value)


def test_the_signature_names_the_key_by_id_and_never_carries_it() -> None:
    sig = S.signature(KEY, LOCK)
    assert KEY.encode() not in sig
    doc = json.loads(sig)
    assert doc["key_id"] == S.key_id(KEY) != S.key_id(KEY + "x") and len(doc["key_id"]) == 16
    with pytest.raises(S.UntrustedLock) as info:
        S.verify_signature(KEY + "x", LOCK, sig)
    assert S.key_id(KEY) in str(info.value) and S.key_id(KEY + "x") in str(info.value)


def test_pins_must_all_match() -> None:
    lock = json.loads(LOCK)
    S.check_pins(lock, {"model": "aa"})
    for pins in ({"model": "bb"}, {"model": "aa", "metrics.json": "cc"}):
        with pytest.raises(S.UntrustedLock) as info:
            S.check_pins(lock, pins)
        assert "mlflow.reuse_pins pins" in str(info.value)


def test_auto_picks_a_collision_resistant_hash_for_reuse() -> None:
    assert choose_algorithm("auto", None, collision_resistant=True) in ("blake3", "sha256")
    # a lock written with xxh3_128 is not kept when reuse needs more
    assert choose_algorithm("auto", "xxh3_128", collision_resistant=True) in ("blake3", "sha256")
    assert choose_algorithm("auto", "sha256", collision_resistant=True) == "sha256"
    assert choose_algorithm("auto", "xxh3_128") == "xxh3_128"   # without reuse: unchanged


def test_health_waits_as_long_as_mlflow_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """/health used a fixed 10 s; a busy server's first answer can take longer."""
    from ansible.module_utils import urls
    seen: Dict[str, Any] = {}

    class Resp:
        def __enter__(self) -> "Resp":
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

        def read(self) -> bytes:
            return b"OK"

    def fake_open_url(url: str, **kw: Any) -> Resp:
        seen.update(kw, url=url)
        return Resp()

    monkeypatch.setattr(urls, "open_url", fake_open_url)
    M.MlflowClient("http://127.0.0.1:1", timeout=45).health()
    assert seen["url"].endswith("/health") and seen["timeout"] == 45


# -- the option rules, through the module ---------------------------------------------------
def reuse_args(proj: Path, **mlflow: Any) -> Dict[str, Any]:
    # Port 9 (discard) is never contacted: every case here is refused before MLflow is.
    return args(proj, mlflow=dict({"tracking_uri": "http://127.0.0.1:9", "reuse": True}, **mlflow))


@pytest.mark.parametrize("extra, option, words", [
    ({}, "mlflow.reuse", "set mlflow.signing_key"),
    ({"signing_key": "x7Qz9"}, "mlflow.signing_key", "shorter than 16 characters"),
    ({"signing_key": KEY, "_algo": "xxh3_128"}, "hash_algorithm", "not collision resistant"),
    ({"signing_key": KEY, "_algo": "md5"}, "hash_algorithm", "use blake3 or sha256"),
    ({"reuse_pins": {"model/": "aa"}}, "mlflow.reuse_pins", "are not outs of this stage"),
    ({"reuse_pins": {"out.txt": ""}}, "mlflow.reuse_pins", "is not a mapping of out to hash"),
    ({"reuse": False, "reuse_pins": {"out.txt": "aa"}}, "mlflow.reuse_pins", "mlflow.reuse is not"),
])
def test_reuse_without_a_trust_anchor_is_refused(tmp_path: Path, extra: Dict[str, Any],
                                                 option: str, words: str) -> None:
    proj = _project(tmp_path)
    ok(args(proj))
    before = lock_bytes(proj)
    extra = dict(extra)
    algo = extra.pop("_algo", None)
    a = reuse_args(proj, **extra)
    if algo:
        a["hash_algorithm"] = algo
    for check in (True, False):
        res = ml(a, check=check)
        assert res["failed"] and ("option %s:" % option) in res["msg"] and words in res["msg"], res
        assert "Traceback" not in res.get("module_stderr", "")
        assert KEY not in json.dumps(res)
    assert runs(proj) == 1 and lock_bytes(proj) == before


def test_partial_pins_need_the_signing_key(tmp_path: Path) -> None:
    proj = _project(tmp_path)
    a = args(proj, outs=["out.txt", "extra.txt"], env={"EXTRA_OUTS": "extra.txt"})
    res = ml(dict(a, mlflow={"tracking_uri": "http://127.0.0.1:9", "reuse": True,
                             "reuse_pins": {"out.txt": "aa"}}))
    assert res["failed"] and "leaves outs extra.txt unpinned" in res["msg"], res
    assert runs(proj) == 0
