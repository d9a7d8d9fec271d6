"""Everything a bit-exact resume needs, as one picklable dict: see :func:`capture`.

A training loop that resumes exactly where it stopped::

    pos = DataPosition(loader)
    found = ckpt.load_latest()
    if found:
        restore(found[1], model=model, optimizer=opt, scheduler=sched, data=pos)
    for epoch in pos.epochs(num_epochs):
        for batch in pos:
            ...forward, backward, opt.step(), sched.step()...
            if pos.step % 100 == 0:
                ckpt.save(capture(model=model, optimizer=opt, scheduler=sched, data=pos), pos.step)

Capture after the optimizer step of a batch: that batch then counts as done. The captured dict
holds live tensors (the model's and optimizer's own); save it at once, or with an asynchronous
:class:`~slurmkit.runtime.checkpoint.Checkpointer`, which snapshots it.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader


def rng_state() -> dict[str, Any]:
    """The states of Python's ``random``, numpy's global RNG (if numpy is loaded), torch's CPU
    generator and, once CUDA is initialized, every CUDA device's generator."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy  # an optional library: there only when the state holds its RNG

        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DataParallel/DistributedDataParallel: checkpoints without 'module.'."""
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    return model.module if isinstance(model, wrappers) else model


class DataPosition:
    """Where training is in a DataLoader's epochs, resumable mid-epoch with the same batches.

    ``epoch``; ``batch``: batches of this epoch done; ``step``: batches done in all. At each
    epoch start it records the generator that shuffles (the loader's ``generator``, else torch's
    global one). On resume it rewinds that generator to the epoch start, rebuilds the epoch's
    iterator and skips the batches done by loading them again (through the loader's public
    iterator: its sampler, workers and their RNGs then reach the same states). The global RNG
    states are left as :func:`restore` set them.
    """

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.epoch = 0
        self.batch = 0
        self.step = 0
        self._epoch_rng: torch.Tensor | None = None

    def _generator(self) -> torch.Generator:
        return self.loader.generator or torch.default_generator

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Epoch numbers from the current one up to ``num_epochs``; iterate ``self`` in each.

        Stops early once an epoch's loop is left before its end (a ``break`` out of the batches).
        """
        while self.epoch < num_epochs:
            epoch = self.epoch
            yield epoch
            if self.epoch == epoch:
                return

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch's batches; then the next epoch begins."""
        set_epoch = getattr(self.loader.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(self.epoch)
        batches: Iterator[Any]
        if self.batch == 0:
            self._epoch_rng = self._generator().get_state()
            batches = iter(self.loader)
        else:
            if self._epoch_rng is None:
                raise RuntimeError("DataPosition: mid-epoch position without its epoch's RNG state")
            batches = self._rewind()
        for batch in batches:
            self.batch += 1
            self.step += 1
            yield batch
        self.epoch += 1
        self.batch = 0

    def _rewind(self) -> Iterator[Any]:
        assert self._epoch_rng is not None
        restored = rng_state()
        self._generator().set_state(self._epoch_rng)
        batches = iter(self.loader)
        for _ in range(self.batch):  # loaded again: the loader's RNGs reach the same states
            next(batches)
        set_rng_state(restored)
        return batches

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "step": self.step,
            "epoch_rng": self._epoch_rng,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batch, self.step = state["epoch"], state["batch"], state["step"]
        self._epoch_rng = state["epoch_rng"]


def capture(
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    data: DataPosition | None = None,
    extra: Any = None,
) -> dict[str, Any]:
    """State dicts of what is given, the RNG states, the data position and ``extra`` (any
    picklable object: counters, best metric, a numpy ``Generator``...)."""
    state: dict[str, Any] = {"rng": rng_state()}
    if model is not None:
        state["model"] = _unwrap(model).state_dict()
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    if data is not None:
        state["data"] = data.state_dict()
    if extra is not None:
        state["extra"] = extra
    return state


def restore(
    state: dict[str, Any],
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    data: DataPosition | None = None,
    strict: bool = True,
) -> Any:
    """Load what :func:`capture` saved into the objects given, RNG states last; returns ``extra``.

    ``strict`` applies to the model's keys. An object given without its part in ``state``
    raises ``KeyError``.
    """
    parts = {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "scaler": scaler,
        "data": data,
    }
    missing = [name for name, obj in parts.items() if obj is not None and name not in state]
    if missing:
        raise KeyError(f"checkpoint has no {', '.join(missing)} state")
    if model is not None:
        _unwrap(model).load_state_dict(state["model"], strict=strict)
    for name in ("optimizer", "scheduler", "scaler", "data"):
        if parts[name] is not None:
            parts[name].load_state_dict(state[name])
    set_rng_state(state["rng"])
    return state.get("extra")
