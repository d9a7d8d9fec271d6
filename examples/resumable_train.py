"""A training run that survives preemption, time limits and node loss, and resumes bit-exactly.

Deterministic CPU training (dropout, a shuffled DataLoader, an LR schedule). It checkpoints
every ``ckpt_every`` steps and, when Slurm asks (the requeue signal or SIGTERM), at the very
next step boundary; then it exits with the "requeue me" code. A rerun resumes from the newest
valid checkpoint, so the final metrics equal an uninterrupted run's exactly.

    python examples/resumable_train.py steps=300 step_time=0.05   # by hand, outside a sweep
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time

import torch

import slurmkit
from slurmkit.runtime import preemption, torchstate
from slurmkit.runtime.checkpoint import Checkpointer

DEFAULTS = {"steps": 300, "lr": 0.05, "ckpt_every": 50, "step_time": 0.0, "seed": 0}


def config() -> dict:
    cfg = dict(DEFAULTS)
    cfg.update(slurmkit.params())
    for arg in sys.argv[1:]:
        key, _, value = arg.partition("=")
        if key in DEFAULTS and not slurmkit.params():
            cfg[key] = type(DEFAULTS[key])(value)
    return cfg


def main() -> None:
    cfg = config()
    preemption.install()
    torch.manual_seed(cfg["seed"])
    torch.set_num_threads(1)
    x = torch.randn(2048, 16)
    y = (x[:, :4].sum(1) > 0).long()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y),
        batch_size=64,
        shuffle=True,
        generator=torch.Generator().manual_seed(1),
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 2)
    )
    optim = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=100, gamma=0.5)
    data = torchstate.DataPosition(loader)
    root = os.path.join(slurmkit.runtime.trial_dir() or tempfile.mkdtemp(), "checkpoints")
    ckpt = Checkpointer(root, keep=2, async_save=True)
    latest = ckpt.load_latest()
    losses: list[float] = []
    if latest is not None:
        step, state = latest
        losses = torchstate.restore(state, model=model, optimizer=optim, scheduler=sched, data=data)
        print(f"resumed from step {step}", flush=True)
    start = data.step
    print(f"training from step {start}", flush=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    epochs = -(-cfg["steps"] // len(loader))
    for _epoch in data.epochs(epochs if data.step < cfg["steps"] else 0):
        for xb, yb in data:
            optim.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optim.step()
            sched.step()
            losses.append(loss.item())
            time.sleep(cfg["step_time"])
            done = data.step >= cfg["steps"]
            if done or preemption.should_stop() or data.step % cfg["ckpt_every"] == 0:
                ckpt.save(
                    torchstate.capture(
                        model=model, optimizer=optim, scheduler=sched, data=data, extra=losses
                    ),
                    data.step,
                    overlap=optim,
                )
            if done:
                break
            if preemption.should_stop():
                print(f"stopping at step {data.step} ({preemption.received()})", flush=True)
                ckpt.close()
                preemption.exit_for_requeue()
        if data.step >= cfg["steps"]:
            break
    ckpt.close()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    digest = hashlib.sha256(repr(flat).encode())
    slurmkit.report(
        loss=losses[-1],
        mean_loss=sum(losses) / len(losses),
        steps=data.step,
        params_sha256=digest.hexdigest(),
        resumed_at=start,
    )
    print(f"done: {data.step} steps, loss {losses[-1]:.6f}", flush=True)


if __name__ == "__main__":
    main()
