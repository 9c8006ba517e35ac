"""Batches read ahead on a background thread, pinned on CUDA, so the copy to the GPU overlaps compute. The
current CUDA device is per thread: the thread sets the run's, or pinning would create a context (and hold its
memory) on GPU 0 from every rank of the node.

The loader's resume state stays what it was (a few integers): the thread records the loader's state after
each batch it reads, and `state_dict()` answers with the state after the last batch *handed out*, so a
checkpoint never skips the batches that were read ahead but not trained on.
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol

import torch

DEPTH = 2  # batches read ahead: one in flight to the GPU, one ready behind it


class WindowSource(Protocol):
    """What the trainer reads batches from (data.windows.RandomWindows, data.mixture.MixtureWindows, a sweep's
    synthetic tokens): (inputs, targets) of a micro-batch, and a position a checkpoint can restore."""

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Prefetcher:
    def __init__(self, loader: WindowSource, batch_size: int, device: torch.device):
        self.loader, self.batch_size = loader, batch_size
        self.pin = device.type == "cuda"
        self.device = device
        self._state = loader.state_dict()
        self._thread = None

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (inputs, targets), on the device (the copy is asynchronous from pinned memory on CUDA)."""
        if self._thread is None:
            self._start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._thread = None
            raise item
        x, y, self._state = item
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def state_dict(self) -> dict:
        return self._state

    def load_state_dict(self, state: dict) -> None:
        self.close()
        self.loader.load_state_dict(state)
        self._state = self.loader.state_dict()

    def close(self) -> None:
        """Stop the thread; the batches it read ahead are dropped (the loader is re-positioned on next use)."""
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            try:  # unblock a producer waiting for room
                self._queue.get(timeout=0.01)
            except queue.Empty:
                pass
        self._thread = None
        self.loader.load_state_dict(self._state)

    def _start(self) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=DEPTH)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="pretrain-prefetch", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            if self.pin:
                torch.cuda.set_device(self.device)
            while not self._stop.is_set():
                x, y = self.loader.next_batch(self.batch_size)
                if self.pin:
                    x, y = x.pin_memory(), y.pin_memory()
                item = (x, y, self.loader.state_dict())
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # a data error surfaces in the training thread, with its message
            self._queue.put(e)
