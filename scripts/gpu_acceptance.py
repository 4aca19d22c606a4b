#!/usr/bin/env python3
"""Optional GPU acceptance test for a GPU worker guest: bf16 matmul TFLOP/s and pinned
host-to-device GB/s with PyTorch, printed as one JSON object.

When a CUDA GPU is visible the figures are compared with a reference capture (default:
../shared/fixtures/h200-passthrough-guest/gpu_bench.json, measured in an H200 passthrough
guest) and must lie within --tolerance (10 %) of it; the exit status is 1 otherwise. The
comparison only applies to the GPU model the reference was taken on. Without torch or
without a GPU the script prints {"skipped": true, "reason": ...} and exits 0.

  python scripts/gpu_acceptance.py [--reference FILE] [--tolerance 0.10] [--size 8192]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REFERENCE = ROOT.parent / "shared" / "fixtures" / "h200-passthrough-guest" / "gpu_bench.json"


def skip(reason: str) -> int:
    print(json.dumps({"skipped": True, "reason": reason}))
    return 0


def time_cuda(torch, fn, iters: int) -> float:
    """Seconds per call, from CUDA events around `iters` calls (after the caller's warm-up)."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _unused in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def matmul_tflops(torch, n: int, iters: int, repeats: int) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _unused in range(3):
        torch.matmul(a, b)
    runs = [2 * n ** 3 / time_cuda(torch, lambda: torch.matmul(a, b), iters) / 1e12 for _unused in range(repeats)]
    return statistics.median(runs)


def h2d_pinned_gbps(torch, mib: int, iters: int, repeats: int) -> float:
    nbytes = mib * 1024 * 1024
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for _unused in range(3):
        dev.copy_(host, non_blocking=True)
    runs = [nbytes / time_cuda(torch, lambda: dev.copy_(host, non_blocking=True), iters) / 1e9 for _unused in range(repeats)]
    return statistics.median(runs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--size", type=int, default=8192, help="matmul n (n x n @ n x n), as in the reference")
    parser.add_argument("--copy-mib", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    ns = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        return skip("torch is not installed")
    if not torch.cuda.is_available():
        return skip("no CUDA GPU visible to torch %s" % torch.__version__)

    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.cuda.get_device_name(0)
    result = {
        "skipped": False,
        "device": device,
        "torch": torch.__version__,
        "matmul_bf16_TFLOPs": matmul_tflops(torch, ns.size, ns.iters, ns.repeats),
        "h2d_pinned_GBps": h2d_pinned_gbps(torch, ns.copy_mib, ns.iters, ns.repeats),
    }
    status = 0
    if ns.reference.is_file():
        reference = json.loads(ns.reference.read_text())
        result["reference"] = str(ns.reference)
        if reference.get("device") != device:
            result["compared"] = False
            result["why_not_compared"] = "reference measured on %s, this is %s" % (reference.get("device"), device)
        else:
            result["compared"] = True
            checks = {}
            for key in ("matmul_bf16_TFLOPs", "h2d_pinned_GBps"):
                ref = float(reference[key])
                ratio = result[key] / ref
                checks[key] = {"measured": result[key], "reference": ref, "ratio": ratio,
                               "within_tolerance": abs(ratio - 1.0) <= ns.tolerance}
            result["checks"] = checks
            result["tolerance"] = ns.tolerance
            result["passed"] = all(c["within_tolerance"] for c in checks.values())
            status = 0 if result["passed"] else 1
    else:
        result["compared"] = False
        result["why_not_compared"] = "reference %s not found" % ns.reference
    print(json.dumps(result, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
