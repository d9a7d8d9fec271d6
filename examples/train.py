"""A tiny real training run for sweeps: an MLP on synthetic data, CPU only, a few seconds.

Reads its parameters from slurmkit (``SLURMKIT_PARAMS``) or, run by hand, from ``key=value``
arguments, e.g. ``python examples/train.py lr=0.05 hidden=64``; reports metrics via slurmkit.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import slurmkit

# eval_every: report the test loss as val_loss every that many epochs (0: only at the end),
# what a sweep's search (early stopping) judges trials by; samples: the data set's size (a
# quarter of it held out for the test loss), what an epoch costs
DEFAULTS = {
    "lr": 0.05,
    "hidden": 64,
    "epochs": 30,
    "batch_size": 128,
    "seed": 0,
    "eval_every": 0,
    "samples": 4096,
}


def parse(argv: list[str]) -> dict:
    cfg = dict(DEFAULTS)
    # nested sweep keys (optim.lr) count by their last part (lr)
    cfg.update({k.rsplit(".", 1)[-1]: v for k, v in slurmkit.params().items()})
    for arg in argv:  # run by hand: key=value
        key, _, value = arg.partition("=")
        cfg[key] = json.loads(value) if value[:1] in "-0123456789.[{tfn" else value
    return cfg


def main() -> None:
    cfg = parse([a for a in sys.argv[1:] if "=" in a and not slurmkit.params()])
    torch.manual_seed(int(cfg["seed"]))
    torch.set_num_threads(1)
    # Synthetic two-class data: points inside or outside a sphere in 10 dimensions.
    x = torch.randn(int(cfg["samples"]), 10)
    y = (x.norm(dim=1) > 3.1).long()
    cut = len(x) * 3 // 4
    train_x, test_x, train_y, test_y = x[:cut], x[cut:], y[:cut], y[cut:]
    model = torch.nn.Sequential(
        torch.nn.Linear(10, int(cfg["hidden"])),
        torch.nn.ReLU(),
        torch.nn.Linear(int(cfg["hidden"]), 2),
    )
    optim = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]), momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    start = time.time()
    bs = int(cfg["batch_size"])
    every = int(cfg["eval_every"])
    for epoch in range(int(cfg["epochs"])):
        perm = torch.randperm(len(train_x))
        for i in range(0, len(train_x), bs):
            idx = perm[i : i + bs]
            optim.zero_grad()
            loss = loss_fn(model(train_x[idx]), train_y[idx])
            loss.backward()
            optim.step()
        metrics = {"train_loss": loss.item()} if epoch % 10 == 9 else {}
        if every and (epoch + 1) % every == 0:
            with torch.no_grad():
                metrics["val_loss"] = loss_fn(model(test_x), test_y).item()
        if metrics:  # under a search, raises slurmkit.Pruned at a rung this trial loses
            slurmkit.report(step=epoch + 1, **metrics)
    with torch.no_grad():
        logits = model(test_x)
        test_loss = loss_fn(logits, test_y).item()
        acc = (logits.argmax(1) == test_y).float().mean().item()
    slurmkit.report(loss=test_loss, acc=acc, seconds=round(time.time() - start, 3))
    print(f"lr={cfg['lr']} hidden={cfg['hidden']}: test loss {test_loss:.4f} acc {acc:.3f}")


if __name__ == "__main__":
    main()
