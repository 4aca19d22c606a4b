"""Stage `prepare`: read the Parquet dataset, split train/test, fit a StandardScaler on the
training part, and write the scaled arrays and the scaler.

    prepare.py DATASET OUTDIR        (parameters from $ML_STAGE_PARAMS: test_fraction, seed)
"""
from __future__ import annotations

import json
import os
import pickle
import sys

import numpy as np
import pyarrow.parquet as pq
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler


def main() -> int:
    dataset, outdir = sys.argv[1], sys.argv[2]
    params = json.load(open(os.environ["ML_STAGE_PARAMS"]))
    table = pq.read_table(dataset)
    target = table.column("target").to_numpy().astype(np.float32)
    feature_names = [c for c in table.column_names if c != "target"]
    x = np.stack([table.column(c).to_numpy() for c in feature_names], axis=1).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, target, test_size=float(params["test_fraction"]), random_state=int(params["seed"]))
    scaler = StandardScaler().fit(x_train)
    os.makedirs(outdir, exist_ok=True)
    for name, array in (("x_train", scaler.transform(x_train)), ("x_test", scaler.transform(x_test)),
                        ("y_train", y_train), ("y_test", y_test)):
        np.save(os.path.join(outdir, name + ".npy"), np.ascontiguousarray(array, dtype=np.float32))
    with open(os.path.join(outdir, "scaler.pkl"), "wb") as handle:
        pickle.dump(scaler, handle)
    with open(os.path.join(outdir, "features.json"), "w") as handle:
        json.dump(feature_names, handle)
    print("train %d rows, test %d rows, %d features" % (len(x_train), len(x_test), x.shape[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
