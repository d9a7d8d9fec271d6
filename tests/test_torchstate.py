"""slurmkit.runtime.torchstate: a run resumed in a fresh process from a mid-epoch checkpoint
ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from slurmkit.runtime.torchstate import (  # noqa: E402
    DataPosition,
    capture,
    restore,
    rng_state,
    set_rng_state,
)

ROOT = Path(__file__).resolve().parent.parent

TRAIN = """
import random, sys
sys.path.insert(0, {root!r})
import torch
from torch.utils.data import DataLoader, Dataset
from slurmkit.runtime.checkpoint import Checkpointer
from slurmkit.runtime.torchstate import DataPosition, capture, restore

mode, ckpt_dir, out = sys.argv[1:4]
workers, own_generator = int(sys.argv[4]), sys.argv[5] == "1"
STEPS, SAVE_AT = 25, 10


class Noisy(Dataset):
    # samples with random augmentation: torch's RNG in the process that loads them
    def __init__(self):
        g = torch.Generator().manual_seed(42)
        self.x, self.y = torch.randn(40, 8, generator=g), torch.randn(40, 1, generator=g)

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return self.x[i] + 0.01 * torch.randn(8), self.y[i]


# the resumed run must get all its state from the checkpoint
torch.manual_seed(0 if mode == "full" else 999)
random.seed(0 if mode == "full" else 999)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                            torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
loader = DataLoader(Noisy(), batch_size=6, shuffle=True, num_workers=workers,
                    generator=torch.Generator().manual_seed(7) if own_generator else None)
pos = DataPosition(loader)
ckpt = Checkpointer(ckpt_dir, async_save=True)
if mode == "resume":
    step, state = ckpt.load_latest()
    assert step == SAVE_AT, step
    restore(state, model=model, optimizer=opt, scheduler=sched, data=pos)
losses = []
for epoch in pos.epochs(100):
    for x, y in pos:
        loss = torch.nn.functional.mse_loss(model(x), y) * (1 + random.random())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.detach())
        if pos.step == SAVE_AT and mode == "full":
            ckpt.save(capture(model=model, optimizer=opt, scheduler=sched, data=pos), pos.step)
        if pos.step == STEPS:
            break
    if pos.step == STEPS:
        break
ckpt.close()
torch.save({{"losses": losses, "params": model.state_dict(), "epoch": pos.epoch}}, out)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers,own_generator",
    [(0, False), (2, True)],
    ids=["global-rng,no-workers", "loader-generator,2-workers"],
)
def test_resume_in_fresh_process_is_bit_exact(
    tmp_path: Path, workers: int, own_generator: bool
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(root=str(ROOT)))

    def train(mode: str) -> dict:
        out = tmp_path / f"{mode}.pt"
        proc = subprocess.run(
            [
                sys.executable,
                str(script),
                mode,
                str(tmp_path / "ckpt"),
                str(out),
                str(workers),
                str(int(own_generator)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return torch.load(out)

    full = train("full")  # 25 steps, a checkpoint at step 10 (epoch 1, batch 3 of 7)
    resumed = train("resume")  # a fresh process: step 10 to 25
    assert len(full["losses"]) == 25 and len(resumed["losses"]) == 15
    pairs = zip(full["losses"][10:], resumed["losses"], strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert full["params"].keys() == resumed["params"].keys()
    assert all(torch.equal(full["params"][k], resumed["params"][k]) for k in full["params"])
    assert full["epoch"] == resumed["epoch"] == 3


def test_rng_state_round_trip() -> None:
    numpy = pytest.importorskip("numpy")
    state = rng_state()
    expected = (random.random(), torch.rand(3), numpy.random.rand(3))
    random.random(), torch.rand(3), numpy.random.rand(3)
    set_rng_state(state)
    assert random.random() == expected[0] and torch.equal(torch.rand(3), expected[1])
    assert (numpy.random.rand(3) == expected[2]).all()


@pytest.mark.slow
def test_restore_scaler_extra_and_missing_parts() -> None:
    model = torch.nn.Linear(2, 2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    state = capture(model=model, scaler=scaler, extra={"best": 0.5})
    fresh_model, fresh_scaler = torch.nn.Linear(2, 2), torch.amp.GradScaler("cpu")
    assert restore(state, model=fresh_model, scaler=fresh_scaler) == {"best": 0.5}
    assert fresh_scaler.state_dict() == scaler.state_dict()
    assert torch.equal(fresh_model.weight, model.weight)
    with pytest.raises(KeyError, match="optimizer"):
        restore(state, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_data_position_replays_the_epoch_order() -> None:
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=3, shuffle=True)
    pos = DataPosition(loader)
    seen = []
    for batch in pos:
        seen.append(batch.tolist())
        if pos.batch == 2:
            saved = pos.state_dict()
            torch.rand(5)  # the global RNG moves on after the capture
    again = DataPosition(loader)
    again.load_state_dict(saved)
    assert [b.tolist() for b in again] == seen[2:]
    assert (again.epoch, again.batch, again.step) == (1, 0, 4)
