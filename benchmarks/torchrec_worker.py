"""The TorchRec run of `keras_bench.py`, in its own process (no TensorFlow loaded).

TensorFlow's and PyTorch's thread pools slow each other down in one process,
so `keras_bench.py` starts this script and drives it over stdin/stdout:

  argv: BATCHES.npz ROWS_PER_TABLE(comma-separated) LEARNING_RATE
  stdin: "<k>" lines: train k steps, then answer "done"; EOF ends the process.
  stdout: "ready" once built, "done" after each command; "skipped: ..." if the
          optional `bench` extra (torch, fbgemm-gpu-cpu, torchrec) is missing.

The model: TorchRec `FusedEmbeddingBagCollection` (one table per feature,
SUM pooling of one id per bag, FBGEMM's fused row-wise Adagrad applied in the
backward pass), bottom MLP 13-64-16, top MLP 432-256-128-1, sigmoid +
binary cross-entropy (`BCEWithLogitsLoss`), Adam on the MLP; raw ids are
hashed to rows by modulo inside the step.
"""

from __future__ import annotations

import os
import sys

import numpy as np

DIM, NUM_CAT, NUM_DENSE = 16, 26, 13


def build(batches, sizes, lr):
    import fbgemm_gpu  # noqa: F401 - registers the FBGEMM CPU kernels
    import torch
    import torchrec
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.optim import RowWiseAdagrad

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    keys = [f"C{i + 1}" for i in range(NUM_CAT)]
    tables = [
        torchrec.EmbeddingBagConfig(
            name=f"t_{k}",
            embedding_dim=DIM,
            num_embeddings=n,
            feature_names=[k],
            pooling=torchrec.PoolingType.SUM,
        )
        for k, n in zip(keys, sizes, strict=True)
    ]
    ebc = FusedEmbeddingBagCollection(
        tables, optimizer_type=RowWiseAdagrad, optimizer_kwargs={"lr": lr}
    )
    nn = torch.nn
    bottom = nn.Sequential(nn.Linear(NUM_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU())
    top = nn.Sequential(
        nn.Linear(DIM * (NUM_CAT + 1), 256),
        nn.ReLU(),
        nn.Linear(256, 128),
        nn.ReLU(),
        nn.Linear(128, 1),
    )
    opt = torch.optim.Adam([*bottom.parameters(), *top.parameters()])
    loss_fn = nn.BCEWithLogitsLoss()
    mods = torch.tensor(sizes, dtype=torch.int64)
    data = [tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in b) for b in batches]
    lengths = torch.ones(NUM_CAT * data[0][0].shape[0], dtype=torch.int64)

    def step(d, c, y):
        rows = torch.remainder(c, mods).t().reshape(-1)  # feature-major values
        kjt = torchrec.KeyedJaggedTensor.from_lengths_sync(keys=keys, values=rows, lengths=lengths)
        pooled = ebc(kjt).values()  # [b, 26 * 16]
        loss = loss_fn(top(torch.cat([bottom(d), pooled], 1)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # also updates the embedding rows (fused row-wise Adagrad)
        opt.step()

    state = {"s": 0}

    def train(k):
        for _ in range(k):
            step(*data[state["s"] % len(data)])
            state["s"] += 1

    return train


def main(argv):
    path, sizes, lr = argv[1], [int(n) for n in argv[2].split(",")], float(argv[3])
    with np.load(path) as f:
        batches = list(zip(f["dense"], f["cats"], f["label"], strict=True))
    try:
        train = build(batches, sizes, lr)
    except ImportError as error:
        print(
            f"skipped: {error.name} is not installed (optional `bench` extra, see "
            "keras_bench.py --help)",
            flush=True,
        )
        return
    print("ready", flush=True)
    for line in sys.stdin:
        train(int(line))
        print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv)
