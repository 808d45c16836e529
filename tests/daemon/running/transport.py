"""An asyncio transport that keeps what is written: the keeper wire's far end."""

from __future__ import annotations

import asyncio


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.sent: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True
