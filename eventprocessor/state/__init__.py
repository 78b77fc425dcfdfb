"""Per-partition state that moves with ownership (``EventProcessor(..., stateful=True)``).

* :class:`PartitionState` is ``context.state``: JSON values by key, private to the claim;
* :class:`StateLog` keeps it in the checkpoint store the processors already share, as a
  chain of changes with snapshots, committed together with the checkpoint;
* :class:`StateKeeper` is one claim's state: restored before the first dispatch, rolled
  back when a batch fails, committed by ``update_checkpoint``, compacted in the
  background.
"""
from .keeper import StateKeeper
from .log import Restored, StateLog, StateUnreadableError
from .mapping import MAX_VALUE_BYTES, PartitionState

__all__ = ["PartitionState", "StateLog", "StateKeeper", "StateUnreadableError", "Restored", "MAX_VALUE_BYTES"]
