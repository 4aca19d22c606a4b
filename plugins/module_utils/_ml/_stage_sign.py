# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``mlflow.reuse`` trusts: a stage lock signed by this site, or outs the task pins.

Anyone who can write to the tracking server can upload a run with any lock and any
outputs. Hash checks against that run's own lock therefore prove only that the download
is intact, not that the outputs are what this site's command made. So a lock is trusted
only when

- it carries an HMAC-SHA256 signature under ``mlflow.signing_key``, a secret the site's
  machines share and the tracking server never sees (it gets the signature, not the key);
- or every out's hash in it equals the hash the task pins in ``mlflow.reuse_pins``.

The signed message is the exact bytes uploaded as ``ml_stage/lock.json``, after a fixed
prefix, so a signature cannot be replayed for anything else.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Dict, Mapping

LOCK_ARTIFACT = "ml_stage/lock.json"
SIGNATURE_ARTIFACT = "ml_stage/lock.json.sig"
KEY_ID_TAG = "mlinfra.stage.signed_by"
ALGORITHM = "hmac-sha256"
_PREFIX = b"mlinfra.kvm ml_stage lock v1\n"
_KEY_ID_PREFIX = b"mlinfra.kvm ml_stage key id\n"
MIN_KEY_LENGTH = 16


class UntrustedLock(Exception):
    """The lock of a run that could be reused is not one this task trusts; says why."""


def key_id(key: str) -> str:
    """A short public name for a signing key (tags and messages never carry the key)."""
    return hashlib.sha256(_KEY_ID_PREFIX + key.encode("utf-8")).hexdigest()[:16]


def _mac(key: str, body: bytes) -> str:
    return hmac.new(key.encode("utf-8"), _PREFIX + body, hashlib.sha256).hexdigest()


def signature(key: str, body: bytes) -> bytes:
    """The ``lock.json.sig`` artifact for the lock bytes ``body``."""
    doc = {"algorithm": ALGORITHM, "key_id": key_id(key), "mac": _mac(key, body)}
    return (json.dumps(doc, sort_keys=True) + "\n").encode("utf-8")


def verify_signature(key: str, body: bytes, sig: bytes) -> None:
    """Raises UntrustedLock unless ``sig`` is this key's signature of ``body``."""
    try:
        doc = json.loads(sig.decode("utf-8"))
    except ValueError:
        raise UntrustedLock("its %s is not JSON" % SIGNATURE_ARTIFACT)
    if not isinstance(doc, dict) or doc.get("algorithm") != ALGORITHM:
        raise UntrustedLock("its lock signature is not %s" % ALGORITHM)
    mine = key_id(key)
    if doc.get("key_id") != mine:
        raise UntrustedLock("its lock is signed with another key (key id %s; mlflow.signing_key "
                            "has key id %s)" % (doc.get("key_id"), mine))
    if not isinstance(doc.get("mac"), str) or not hmac.compare_digest(doc["mac"], _mac(key, body)):
        raise UntrustedLock("its lock does not match its signature (changed after it was signed)")


def check_pins(lock: Mapping[str, Any], pins: Mapping[str, str]) -> None:
    """Raises UntrustedLock unless every pinned out has the pinned hash in ``lock``."""
    outs: Dict[str, Any] = lock.get("outs") or {}
    for out, want in sorted(pins.items()):
        got = (outs.get(out) or {}).get("hash")
        if got != want:
            raise UntrustedLock("its out %s has hash %s, mlflow.reuse_pins pins %s" % (out, got, want))
