"""Atomic, checksummed checkpoints on a local directory or any fsspec URL (stdlib only at
import): the public API, from :mod:`.checkpointer` (the :class:`Checkpointer`: saving, loading,
resuming), :mod:`.directory` (:class:`CheckpointDir`, one root: its layout, commit records,
commits and pruning) and the modules they are built on: :mod:`.storage`, :mod:`.writer`,
:mod:`.reader`, :mod:`.snapshot`, :mod:`.mirror` and :mod:`.collectives`.
"""

from .checkpointer import Checkpointer
from .collectives import agree_step
from .directory import COMMIT, CheckpointDir
from .storage import CheckpointError

__all__ = ["COMMIT", "CheckpointDir", "CheckpointError", "Checkpointer", "agree_step"]
