"""One rank of `dist_bench.py`'s TorchRec run (a process without TensorFlow).

`dist_bench.py --torchrec_python=PYTHON` starts this script with that Python (one
where the optional `bench` extra and torchrec are installed, docs/benchmarks.md) once
per rank; the ranks meet over gloo on 127.0.0.1 (environment: RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; TORCHREC_THREADS: torch's intra-op threads).

The model is `dist_bench.py`'s DLRM model in PyTorch: an `EmbeddingBagCollection` of
26 tables (one per feature, dim 16, SUM pooling of one id per bag; raw ids mapped to
rows by modulo), bottom MLP 13-64-16, top MLP 432-256-128-1, `BCEWithLogitsLoss`;
FBGEMM's fused row-wise Adagrad on the tables (applied inside the backward pass),
Adam on the MLP. `DistributedModelParallel` shards the tables (`--sharding`:
table-wise, or row-wise which TorchRec's sharder offers for GPUs only
and is allowed here; FUSED kernels) and wraps the MLP in DistributedDataParallel;
each rank trains on its slice of every global batch (rank r: rows r*B/W..(r+1)*B/W).
A world of 1 is the one-process baseline: the same program, no other rank.

Rank 0 writes `--out` (JSON): the samples/s of the global batch per round (from a
barrier to a barrier), or {"skipped": why} when torch, fbgemm-gpu or torchrec does
not import. Every collective has `--timeout` seconds, so a lost rank ends the others.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

DIM, NUM_CAT, NUM_DENSE = 16, 26, 13


def _args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", required=True, help="npz of dense, cats, label (global batches)")
    p.add_argument("--sizes", required=True, help="rows per table, comma-separated")
    p.add_argument("--lr", type=float, required=True, help="row-wise Adagrad learning rate")
    p.add_argument("--sharding", choices=["table_wise", "row_wise"], default="table_wise")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per collective")
    p.add_argument("--out", required=True)
    return p.parse_args()


def _imports():
    """torch, torchrec and FBGEMM, or an ImportError naming the missing module."""
    import fbgemm_gpu  # noqa: F401 - registers FBGEMM's CPU kernels
    import torch
    import torchrec

    return torch, torchrec


def build(args, rank: int, world: int):
    """The sharded model and a `step(d, c, y)` on this rank's part of a global batch."""
    torch, torchrec = _imports()
    import torch.distributed as dist
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    nn = torch.nn
    sizes = [int(n) for n in args.sizes.split(",")]
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

    class DLRM(nn.Module):
        def __init__(self):
            super().__init__()
            self.sparse = torchrec.EmbeddingBagCollection(tables, device=torch.device("meta"))
            self.bottom = nn.Sequential(
                nn.Linear(NUM_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU()
            )
            self.top = nn.Sequential(
                nn.Linear(DIM * (NUM_CAT + 1), 256),
                nn.ReLU(),
                nn.Linear(256, 128),
                nn.ReLU(),
                nn.Linear(128, 1),
            )

        def forward(self, dense, kjt):
            pooled = self.sparse(kjt).values()  # [b, 26 * 16]
            return self.top(torch.cat([self.bottom(dense), pooled], 1))

    torch.manual_seed(0)
    model = DLRM()
    _apply_optimizer_in_backward(RowWiseAdagrad, model.sparse.parameters(), {"lr": args.lr})
    sharding = {"table_wise": ShardingType.TABLE_WISE, "row_wise": ShardingType.ROW_WISE}
    constraints = {
        t.name: ParameterConstraints(sharding_types=[sharding[args.sharding].value]) for t in tables
    }

    class Sharder(EmbeddingBagCollectionSharder):
        """TorchRec's sharder, with row-wise allowed on CPU (it lists it for GPUs only)."""

        def sharding_types(self, compute_device_type):
            return [*super().sharding_types(compute_device_type), ShardingType.ROW_WISE.value]

    sharders = [Sharder()]
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu", local_world_size=world),
        constraints=constraints,
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(
        module=model, device=torch.device("cpu"), plan=plan, sharders=sharders
    )
    dense_params = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    opt = torch.optim.Adam(dense_params)
    loss_fn = nn.BCEWithLogitsLoss()
    mods = torch.tensor(sizes, dtype=torch.int64)

    def local(d, c, y):
        b = d.shape[0] // world
        part = slice(rank * b, (rank + 1) * b)
        rows = torch.remainder(torch.from_numpy(c[part]), mods).t().reshape(-1)  # by feature
        kjt = torchrec.KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=rows, lengths=torch.ones(NUM_CAT * b, dtype=torch.int64)
        )
        return torch.from_numpy(d[part]), kjt, torch.from_numpy(y[part])

    def step(d, kjt, y):
        loss = loss_fn(dmp(d, kjt), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # also updates the table rows (FBGEMM's fused row-wise Adagrad)
        opt.step()
        return loss

    return local, step, plan


def main():
    args = _args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        torch, _ = _imports()
    except ImportError as error:
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump(
                    {
                        "skipped": f"{error.name} is not importable by {sys.executable} (the bench extra and torchrec, see docs/benchmarks.md; dist_bench.py --torchrec_python)"
                    },
                    f,
                )
        return
    import torch.distributed as dist

    threads = int(os.environ.get("TORCHREC_THREADS", "1"))
    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    try:
        with np.load(args.batches) as f:
            batches = list(zip(f["dense"], f["cats"], f["label"], strict=True))
        local, step, plan = build(args, rank, world)
        data = [local(*b) for b in batches]  # the inputs made before the clock starts
        state = {"s": 0}

        def train(k):
            for _ in range(k):
                step(*data[state["s"] % len(data)])
                state["s"] += 1

        train(args.warmup)
        rates = []
        for _ in range(args.rounds):
            dist.barrier()
            start = time.perf_counter()
            train(args.steps)
            dist.barrier()
            rates.append(batches[0][0].shape[0] * args.steps / (time.perf_counter() - start))
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump(
                    {
                        "rates": rates,
                        "world_size": world,
                        "threads": threads,
                        "sharding": args.sharding,
                        "torch": torch.__version__,
                        "plan": str(plan)[:2000],
                    },
                    f,
                )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
