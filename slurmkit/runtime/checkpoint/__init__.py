"""Atomic, checksummed checkpoints on a local directory or any fsspec URL (stdlib only at
import): the public API, from :mod:`.checkpointer` (the :class:`Checkpointer`, the on-disk
layout and the commit protocol) and the modules it is built on: :mod:`.storage`,
:mod:`.writer`, :mod:`.snapshot` and :mod:`.collectives`.
"""

from .checkpointer import COMMIT, Checkpointer
from .collectives import agree_step
from .storage import CheckpointError

__all__ = ["COMMIT", "CheckpointError", "Checkpointer", "agree_step"]
