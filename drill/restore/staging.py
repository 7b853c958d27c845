"""Bytes from storage into a tensor that the reader cannot write itself — one on a GPU.

A reader thread reads a tensor's bytes piece by piece into a small ring of host buffers
(pinned, on CUDA) and copies each piece to its place in the target; on CUDA the copy runs on
a side stream, asynchronously, while the thread reads and hashes the next piece into the next
buffer. A buffer is reused only once its copy is done (an event per buffer), so host memory
stays at ``depth × piece`` per reader thread whatever the checkpoint's size, and there is no
intermediate tensor per entry. On the CPU the same loop copies synchronously (a target that
is not contiguous).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from drill.integrity.reading import Crc

PIECE_BYTES = 16 << 20
"""Per copy: large enough for full host-to-device bandwidth, small enough to overlap well."""
DEPTH = 4
"""Buffers in the ring: reading one while up to three copies are in flight."""


class PieceSource(Protocol):
    def read_into(self, view: memoryview, crc: Crc | None = None) -> None: ...


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable view of a contiguous CPU tensor's bytes (any dtype), without a copy."""
    import ctypes

    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def flat_bytes(t: torch.Tensor) -> torch.Tensor | None:
    """A contiguous tensor's storage as a 1-D uint8 tensor on its device; None when it has no
    such view (not contiguous, or a dtype that cannot be viewed as bytes)."""
    if not t.is_contiguous():
        return None
    try:
        return t.reshape(-1).view(torch.uint8)
    except RuntimeError:
        return None


class Stager:
    """One reader thread's ring of host buffers towards ``device``. ``finish()`` when the
    thread is done with a file: it waits for the copies in flight."""

    def __init__(self, device: torch.device, piece: int = PIECE_BYTES, depth: int = DEPTH) -> None:
        self.device, self.piece, self.depth = device, piece, depth
        self.cuda = device.type == "cuda"
        self._buffers: list[torch.Tensor] = []
        self._events: list[Any] = [None] * depth
        self._next = 0
        self._stream: Any = None
        if self.cuda:
            # Whatever is still queued on the device (a trainer's initialization of the very
            # targets, on any of its streams) finishes before the first byte lands.
            torch.cuda.synchronize(device)
            self._stream = torch.cuda.Stream(device)

    def copy(self, source: PieceSource, target: torch.Tensor, crc: bool = False) -> int | None:
        """Read ``target``'s bytes from ``source`` into it; with ``crc``, their CRC-32."""
        flat = flat_bytes(target)
        dense = target if flat is not None else torch.empty(target.shape, dtype=target.dtype, device=target.device)
        flat = flat if flat is not None else flat_bytes(dense)
        if flat is None:
            raise TypeError(f"a {target.dtype} tensor cannot be viewed as bytes")
        running = Crc() if crc else None
        for start in range(0, flat.numel(), self.piece):
            n = min(self.piece, flat.numel() - start)
            slot = self._take()
            buf = self._buffers[slot][:n]
            source.read_into(byte_view(buf), running)  # inline: the ring reuses the buffer
            self._send(slot, flat[start : start + n], buf)
        if dense is not target:
            self._run(lambda: target.copy_(dense, non_blocking=self.cuda))
            if self._stream is not None:
                self._stream.synchronize()  # before the temporary's memory can be handed out again
        return running.value() if running is not None else None

    def finish(self) -> None:
        """Wait until every copy has landed: the targets are then complete for any stream."""
        if self._stream is not None:
            self._stream.synchronize()
        self._events = [None] * self.depth

    def _take(self) -> int:
        """The next slot of the ring, once the copy out of its buffer is done."""
        i = self._next
        self._next = (i + 1) % self.depth
        if i == len(self._buffers):
            self._buffers.append(torch.empty(self.piece, dtype=torch.uint8, pin_memory=self.cuda))
        if self._events[i] is not None:
            self._events[i].synchronize()
            self._events[i] = None
        return i

    def _send(self, slot: int, dst: torch.Tensor, buf: torch.Tensor) -> None:
        self._run(lambda: dst.copy_(buf, non_blocking=self.cuda))
        if self._stream is not None:
            event = torch.cuda.Event()
            event.record(self._stream)
            self._events[slot] = event

    def _run(self, op: Any) -> None:
        if self._stream is None:
            op()
            return
        with torch.cuda.stream(self._stream):
            op()


class Stagers:
    """One reader thread's stagers, one per target device, made when a target first needs it."""

    def __init__(self) -> None:
        self._by_device: dict[torch.device, Stager] = {}

    def __call__(self, device: torch.device) -> Stager:
        stager = self._by_device.get(device)
        if stager is None:
            stager = self._by_device[device] = Stager(device)
        return stager

    def finish(self) -> None:
        for stager in self._by_device.values():
            stager.finish()
