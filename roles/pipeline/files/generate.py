"""Stage `data`: a reproducible synthetic regression dataset as Parquet.

Reads its parameters (rows, features, seed) from $ML_STAGE_PARAMS. The target is a smooth
non-linear function of the features plus noise, so an MLP has something to learn that a
linear model cannot.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def main() -> int:
    params = json.load(open(os.environ["ML_STAGE_PARAMS"]))
    rows, features, seed = int(params["rows"]), int(params["features"]), int(params["seed"])
    out = sys.argv[1] if len(sys.argv) > 1 else "data/dataset.parquet"
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features), dtype=np.float32)
    w = rng.standard_normal(features).astype(np.float32)
    y = (x @ w + 2.0 * np.sin(x[:, 0] * x[:, 1]) + 0.5 * x[:, 2] ** 2
         + rng.normal(0.0, 0.5, rows).astype(np.float32)).astype(np.float32)
    columns = {"f%02d" % i: x[:, i] for i in range(features)}
    columns["target"] = y
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    tmp = out + ".tmp"
    pq.write_table(pa.table(columns), tmp, compression="zstd")
    os.replace(tmp, out)
    print("wrote %s: %d rows x %d features" % (out, rows, features))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
