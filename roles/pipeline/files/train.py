#!/usr/bin/env python3
"""Stage `train`: an MLP regression (Linear F-256-128-1 with dropout, Adam, MSE) in PyTorch.

    train.py PREPARED_DIR MODEL_OUT METRICS_OUT     (parameters from $ML_STAGE_PARAMS)

CUDA when a GPU is visible, CPU otherwise. On a GPU the whole training set stays on the
device, the step runs under bf16 autocast with a fused Adam, and the loss is read back once
per epoch: the naive fp32 loop is bound by fp32 matmuls and per-step host syncs.
When MLflow runs the stage (MLFLOW_RUN_ID set by ml_stage), the per-epoch loss, the test
RMSE and the model are logged to that same run.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Dict, List

import numpy as np
import torch
from torch import nn


def build_model(features: int, hidden: List[int], dropout: float) -> nn.Module:
    layers: List[nn.Module] = []
    width = features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
        width = size
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def pick_precision(requested: str, device: torch.device) -> torch.dtype:
    if requested == "fp32" or device.type != "cuda":
        return torch.float32
    if requested == "bf16" or torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def train(params: Dict, prepared: str, device: torch.device) -> Dict:
    torch.manual_seed(int(params.get("seed", 0)))
    load = lambda name: torch.from_numpy(np.load(os.path.join(prepared, name + ".npy")))  # noqa: E731
    x_train, y_train = load("x_train").to(device), load("y_train").to(device)
    x_test, y_test = load("x_test").to(device), load("y_test").to(device)
    model = build_model(x_train.shape[1], [int(h) for h in params["hidden"]], float(params["dropout"])).to(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if params.get("compile") and device.type == "cuda":
        model = torch.compile(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(params["lr"]), fused=device.type == "cuda")
    dtype = pick_precision(str(params.get("precision", "auto")), device)
    epochs, batch = int(params["epochs"]), int(params.get("batch_size", 0)) or x_train.shape[0]
    rows = x_train.shape[0]
    losses: List[float] = []
    timed_from = None
    for epoch in range(epochs):
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
        losses.append(float(epoch_loss))  # one host sync per epoch
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - timed_from if timed_from is not None else float("nan")
    model.eval()
    with torch.no_grad():
        test_mse = float(nn.functional.mse_loss(model(x_test).squeeze(-1).float(), y_test))
    return {"model": model, "losses": losses, "test_mse": test_mse,
            "rows_per_s": rows * (epochs - 1) / elapsed if epochs > 1 and elapsed > 0 else None,
            "precision": str(dtype).replace("torch.", "")}


def log_to_mlflow(result: Dict, metrics: Dict, model_path: str) -> None:
    if not os.environ.get("MLFLOW_RUN_ID"):
        return
    import mlflow  # only when MLflow tracks this run
    from mlflow.entities import Metric

    with mlflow.start_run() as run:  # attaches to the run ml_stage created (MLFLOW_RUN_ID)
        now = int(time.time() * 1000)
        series = [Metric("train_loss", v, now, step) for step, v in enumerate(result["losses"])]
        series += [Metric(k, float(v), now, 0) for k, v in metrics.items() if isinstance(v, (int, float))]
        client = mlflow.tracking.MlflowClient()
        for start in range(0, len(series), 1000):  # MLflow's log-batch limit
            client.log_batch(run.info.run_id, metrics=series[start:start + 1000])
        mlflow.log_artifact(model_path, artifact_path="model")


def main() -> int:
    prepared, model_out, metrics_out = sys.argv[1], sys.argv[2], sys.argv[3]
    params = json.load(open(os.environ["ML_STAGE_PARAMS"]))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = train(params, prepared, device)
    metrics = {"test_mse": result["test_mse"], "test_rmse": result["test_mse"] ** 0.5,
               "final_train_loss": result["losses"][-1], "epochs": len(result["losses"])}
    if result["rows_per_s"]:
        metrics["rows_per_s"] = result["rows_per_s"]
    model = result["model"]
    state = getattr(model, "_orig_mod", model).state_dict()
    tmp = model_out + ".tmp"
    torch.save({"state_dict": state, "params": params}, tmp)
    os.replace(tmp, model_out)
    with open(metrics_out + ".tmp", "w") as handle:
        json.dump(metrics, handle, indent=1)
    os.replace(metrics_out + ".tmp", metrics_out)
    log_to_mlflow(result, metrics, model_out)
    print(json.dumps(dict(metrics, device=device.type, precision=result["precision"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
