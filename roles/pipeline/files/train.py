"""Stage `train`: an MLP regression (Linear F-256-128-1 with dropout, Adam, MSE) in PyTorch.

    train.py PREPARED_DIR MODEL_OUT METRICS_OUT     (parameters from $ML_STAGE_PARAMS)

CUDA when a GPU is visible, CPU otherwise. On a GPU the whole training set stays on the
device, the step runs under bf16 autocast with a fused Adam, and the loss is read back once
per epoch: the naive fp32 loop is bound by fp32 matmuls and per-step host syncs.
When MLflow runs the stage (MLFLOW_RUN_ID set by ml_stage), the per-epoch loss, the test
RMSE and the model are logged to that same run.

Distributed data parallel: started by torchrun (WORLD_SIZE > 1, or RANK / LOCAL_RANK in the
environment), every process joins a torch.distributed process group (NCCL on cuda:LOCAL_RANK,
gloo on CPU; param `dist_backend` or env ML_TRAIN_DIST_BACKEND, the env winning, overrides
that) whose operations fail after param `dist_timeout_s` seconds (default 300) rather than
hang on a dead peer. The ranks leave together through a barrier of their own gloo group
whose timeout is param `dist_finish_timeout_s` (default 1800): rank 0's evaluation, model save
and MLflow upload after the last all-reduce are not collectives, and under emulation or with a
slow tracking server they outlast `dist_timeout_s`. A rank 0 that dies meanwhile still fails
the others at once (gloo sees its connection close).

Each rank trains on its own disjoint shard of the training rows, the
split of a DistributedSampler(shuffle=True, seed=seed, drop_last=True) at epoch 0, kept for
the run and reshuffled within the shard each epoch for mini-batches; the model is wrapped in
DistributedDataParallel, so gradients are averaged over the ranks. `batch_size` is the global
batch (batch_size // WORLD_SIZE rows per rank and step; 0 = each rank's whole shard). The
per-epoch train_loss is the mean over all ranks; rows_per_s counts the rows of all ranks.
Only rank 0 evaluates the test set, writes MODEL_OUT and METRICS_OUT, logs to MLflow and
prints the result line; the metrics carry world_size and backend (1 and null by plain python).
A failure on any rank ends the script with a non-zero status.

Param `world_size` (set by the pipeline role): when present, the job must have exactly that
many processes, or the script exits 2 before training.

Reports and test hooks (environment):
  ML_TRAIN_RANK_REPORT_DIR   every rank writes rank-<rank>.json there: rank, world_size,
                             backend, device, host, shard_rows, shard_indices (the training-row
                             indices it used in epoch 0) and weights_sha256 (sha256 of the
                             final state_dict's tensors as float32 bytes, in key order).
  ML_TRAIN_DIE_AT_EPOCH      with ML_TRAIN_DIE_RANK (default 0): that rank calls os._exit(1)
                             at the start of that epoch, a crash without any clean-up.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import nn


class Dist:
    """Where this process stands: plain (world 1, no process group) or one rank of torchrun's."""

    def __init__(self, enabled: bool, rank: int, world: int, device: torch.device,
                 backend: Optional[str], finish_group: Optional[object] = None) -> None:
        self.enabled, self.rank, self.world, self.device, self.backend = enabled, rank, world, device, backend
        self.finish_group = finish_group  # the group of the leave-together barrier

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    env = os.environ
    return int(env.get("WORLD_SIZE") or 1) > 1 or "RANK" in env or "LOCAL_RANK" in env


def setup_dist(params: Dict) -> Dist:
    if not launched_by_torchrun():
        return Dist(False, 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu"), None)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError("LOCAL_RANK %d but only %d GPU(s) visible: one process per GPU"
                               % (local_rank, torch.cuda.device_count()))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = (os.environ.get("ML_TRAIN_DIST_BACKEND") or params.get("dist_backend")
               or ("nccl" if device.type == "cuda" else "gloo"))
    kwargs = {"backend": backend, "timeout": timedelta(seconds=float(params.get("dist_timeout_s", 300)))}
    if backend == "nccl":
        kwargs["device_id"] = device  # the communicator is made now, bound to this GPU
    dist.init_process_group(**kwargs)  # env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
    # gloo whatever the training backend: the barrier holds no tensor, only the ranks' exit.
    finish = dist.new_group(backend="gloo",
                            timeout=timedelta(seconds=float(params.get("dist_finish_timeout_s", 1800))))
    return Dist(True, dist.get_rank(), dist.get_world_size(), device, backend, finish)


def build_model(features: int, hidden: List[int], dropout: float) -> nn.Module:
    layers: List[nn.Module] = []
    width = features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
        width = size
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain nn.Module under torch.compile and DistributedDataParallel."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model


def pick_precision(requested: str, device: torch.device) -> torch.dtype:
    if requested == "fp32" or device.type != "cuda":
        return torch.float32
    if requested == "bf16" or torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def shard(rows: int, ctx: Dist, seed: int) -> np.ndarray:
    """This rank's training rows (sorted): the DistributedSampler's epoch-0 split."""
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(range(rows), num_replicas=ctx.world, rank=ctx.rank,
                                 shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(0)
    indices = np.sort(np.fromiter(iter(sampler), dtype=np.int64, count=len(sampler)))
    if indices.size == 0:
        raise RuntimeError("%d training rows cannot be split over %d ranks" % (rows, ctx.world))
    return indices


def die_hook(ctx: Dist, epoch: int) -> None:
    at = os.environ.get("ML_TRAIN_DIE_AT_EPOCH")
    if at and int(at) == epoch and int(os.environ.get("ML_TRAIN_DIE_RANK") or 0) == ctx.rank:
        print("rank %d: ML_TRAIN_DIE_AT_EPOCH=%s, exiting abruptly" % (ctx.rank, at),
              file=sys.stderr, flush=True)
        os._exit(1)


def train(params: Dict, prepared: str, ctx: Dist) -> Dict:
    device = ctx.device
    seed = int(params.get("seed", 0))
    torch.manual_seed(seed)  # the same initial weights on every rank (DDP broadcasts rank 0's too)

    def load(name: str, mmap: Optional[str] = None) -> np.ndarray:
        return np.load(os.path.join(prepared, name + ".npy"), mmap_mode=mmap)

    indices = None
    if ctx.enabled:  # this rank's rows only, copied from a memory map of the whole set
        x_all, y_all = load("x_train", "r"), load("y_train", "r")
        indices = shard(x_all.shape[0], ctx, seed)
        x_train = torch.from_numpy(np.ascontiguousarray(x_all[indices])).to(device)
        y_train = torch.from_numpy(np.ascontiguousarray(y_all[indices])).to(device)
        del x_all, y_all
    else:
        x_train, y_train = torch.from_numpy(load("x_train")).to(device), torch.from_numpy(load("y_train")).to(device)
    hidden = [int(h) for h in params["hidden"]]
    model = build_model(x_train.shape[1], hidden, float(params["dropout"])).to(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if ctx.enabled:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        torch.manual_seed(seed + ctx.rank)  # dropout masks and mini-batch order differ per rank
    if params.get("compile") and device.type == "cuda":
        model = torch.compile(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(params["lr"]), fused=device.type == "cuda")
    dtype = pick_precision(str(params.get("precision", "auto")), device)
    rows = x_train.shape[0]  # this rank's rows
    epochs, batch = int(params["epochs"]), int(params.get("batch_size", 0))
    batch = max(1, batch // ctx.world) if batch > 0 else rows
    losses: List[float] = []
    timed_from = None
    for epoch in range(epochs):
        die_hook(ctx, epoch)
        if epoch == 1:  # the first epoch pays for allocation and kernel selection
            if device.type == "cuda":
                torch.cuda.synchronize()
            timed_from = time.perf_counter()
        model.train()
        order = torch.randperm(rows, device=device) if batch < rows else None
        epoch_loss = torch.zeros((), device=device)
        for start in range(0, rows, batch):
            idx = order[start:start + batch] if order is not None else slice(None)
            xb, yb = x_train[idx], y_train[idx]
            with torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32):
                pred = model(xb).squeeze(-1)
            loss = nn.functional.mse_loss(pred.float(), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.detach() * (xb.shape[0] / rows)
        if ctx.enabled:  # equal shards: the global mean is the mean of the ranks' means
            dist.all_reduce(epoch_loss, op=dist.ReduceOp.SUM)
            epoch_loss /= ctx.world
        losses.append(float(epoch_loss))  # one host sync per epoch
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - timed_from if timed_from is not None else float("nan")
    net = unwrap(model)
    net.eval()
    test_mse = None
    if ctx.main:
        x_test, y_test = torch.from_numpy(load("x_test")).to(device), torch.from_numpy(load("y_test")).to(device)
        with torch.no_grad():
            test_mse = float(nn.functional.mse_loss(net(x_test).squeeze(-1).float(), y_test))
    total = rows * ctx.world  # rows of all ranks per epoch
    return {"model": net, "losses": losses, "test_mse": test_mse, "shard_indices": indices, "shard_rows": rows,
            "rows_per_s": total * (epochs - 1) / elapsed if epochs > 1 and elapsed > 0 else None,
            "precision": str(dtype).replace("torch.", "")}


def weights_sha256(state: Dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for tensor in state.values():
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def write_rank_report(directory: str, ctx: Dist, result: Dict) -> None:
    indices = result["shard_indices"]
    report = {"rank": ctx.rank, "world_size": ctx.world, "backend": ctx.backend, "device": str(ctx.device),
              "host": socket.gethostname(), "shard_rows": result["shard_rows"],
              "shard_indices": indices.tolist() if indices is not None else list(range(result["shard_rows"])),
              "weights_sha256": weights_sha256(result["model"].state_dict())}
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, "rank-%d.json" % ctx.rank)
    with open(target + ".tmp", "w") as handle:
        json.dump(report, handle)
    os.replace(target + ".tmp", target)


def log_to_mlflow(result: Dict, metrics: Dict, model_path: str) -> None:
    if not os.environ.get("MLFLOW_RUN_ID"):
        return
    import mlflow  # only when MLflow tracks this run
    from mlflow.entities import Metric

    with mlflow.start_run() as run:  # attaches to the run ml_stage created (MLFLOW_RUN_ID)
        now = int(time.time() * 1000)
        series = [Metric("train_loss", v, now, step) for step, v in enumerate(result["losses"])]
        series += [Metric(k, float(v), now, 0) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        client = mlflow.tracking.MlflowClient()
        for start in range(0, len(series), 1000):  # MLflow's log-batch limit
            client.log_batch(run.info.run_id, metrics=series[start:start + 1000])
        mlflow.log_artifact(model_path, artifact_path="model")


def run(ctx: Dist, params: Dict, prepared: str, model_out: str, metrics_out: str) -> int:
    result = train(params, prepared, ctx)
    report_dir = os.environ.get("ML_TRAIN_RANK_REPORT_DIR")
    if report_dir:
        write_rank_report(report_dir, ctx, result)
    if not ctx.main:
        return 0
    metrics = {"test_mse": result["test_mse"], "test_rmse": result["test_mse"] ** 0.5,
               "final_train_loss": result["losses"][-1], "epochs": len(result["losses"]),
               "world_size": ctx.world, "backend": ctx.backend}
    if result["rows_per_s"]:
        metrics["rows_per_s"] = result["rows_per_s"]
    state = result["model"].state_dict()
    tmp = model_out + ".tmp"
    torch.save({"state_dict": state, "params": params}, tmp)
    os.replace(tmp, model_out)
    with open(metrics_out + ".tmp", "w") as handle:
        json.dump(metrics, handle, indent=1)
    os.replace(metrics_out + ".tmp", metrics_out)
    log_to_mlflow(result, metrics, model_out)
    print(json.dumps(dict(metrics, device=ctx.device.type, precision=result["precision"])))
    return 0


def main() -> int:
    prepared, model_out, metrics_out = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(os.environ["ML_STAGE_PARAMS"]) as handle:
        params = json.load(handle)
    ctx = setup_dist(params)
    expected = params.get("world_size")
    if expected is not None and int(expected) != ctx.world:
        # The pipeline role puts the world size it planned into the params (and so the key):
        # a launcher that started another number of processes must not train under that key.
        print("param world_size %s but %d process(es) in this job: launch one process per GPU "
              "(one per worker on CPU) on every planned worker, or fix world_size"
              % (expected, ctx.world), file=sys.stderr)
        if ctx.enabled:
            dist.destroy_process_group()
        return 2
    if not ctx.enabled:
        return run(ctx, params, prepared, model_out, metrics_out)
    try:
        rc = run(ctx, params, prepared, model_out, metrics_out)
        # Every rank leaves together: rank 0 still evaluates, saves and logs after the last
        # all-reduce, and a rank that tore its process group down meanwhile was seen to abort
        # (SIGABRT) on its way out when the ranks run under torchrun agents on separate nodes.
        # The wait is bounded by dist_finish_timeout_s, not dist_timeout_s: importing mlflow
        # and uploading the model took rank 0 over a minute on a TCG guest.
        dist.barrier(group=ctx.finish_group)
    except BaseException:  # noqa: B902 - any failure: leave now, without waiting on the peers
        traceback.print_exc()
        print("rank %d of %d failed" % (ctx.rank, ctx.world), file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
