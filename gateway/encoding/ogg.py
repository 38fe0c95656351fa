"""A minimal Ogg page writer (RFC 3533) for one logical stream, written from the spec.

FFmpeg's Ogg muxer closes a page only once it holds ``page_duration`` of audio, and PyAV offers
no way to flush it at a chunk boundary: a short page duration streams but costs a 28-byte page
header per 20 ms Opus packet (~11 kbit/s), a long one holds audio back across chunks. Writing
the pages here lets every chunk's packets leave at once, in one page per chunk.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_CRC_POLY = 0x04C11DB7  # Ogg's CRC-32: this polynomial, MSB first, initial value 0, no final xor
_MAX_SEGMENTS = 255  # lacing values per page
_FLAG_BOS, _FLAG_EOS = 0x02, 0x04  # no 0x01 (continued): packets never span pages
_HEADER = struct.Struct("<4sBBqIII")  # capture, version, flags, granule, serial, sequence, crc


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ _CRC_POLY) if crc & 0x80000000 else crc << 1
        table.append(crc & 0xFFFFFFFF)
    return tuple(table)


_CRC_TABLE = _crc_table()


def ogg_crc(data: bytes) -> int:
    """The Ogg page checksum of ``data`` (computed with the page's CRC field zeroed)."""
    crc = 0
    table = _CRC_TABLE
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ table[(crc >> 24) ^ byte]
    return crc


def _lacing(size: int) -> bytes:
    """Segment-table entries for one packet: 255s, then a value < 255 that ends the packet."""
    return b"\xff" * (size // 255) + bytes([size % 255])


class OggStreamWriter:
    """Packets of one logical bitstream in, complete Ogg pages out.

    Packets are never split across pages (codec packets here are far below the 64 KiB a page
    holds), so every page ends on a packet boundary and carries the granule position after its
    last packet.
    """

    def __init__(self, serial: int) -> None:
        self.serial = serial & 0xFFFFFFFF
        self._sequence = 0
        self._started = False
        self._granule = 0

    def pages(self, packets: Sequence[tuple[bytes, int]], *, last: bool = False) -> bytes:
        """Pages holding ``packets`` (``(data, granule position after it)``), in order.

        The stream's first page gets the beginning-of-stream flag; with ``last`` the final page
        gets end-of-stream (with no ``packets``, an empty end page that repeats the last granule).
        """
        out = bytearray()
        page: list[tuple[bytes, bytes]] = []
        segments = 0
        granule = self._granule
        for data, packet_granule in packets:
            lacing = _lacing(len(data))
            if page and segments + len(lacing) > _MAX_SEGMENTS:
                out += self._page(page, granule, eos=False)
                page, segments = [], 0
            page.append((data, lacing))
            segments += len(lacing)
            granule = packet_granule
        if page or last:
            out += self._page(page, granule, eos=last)
        return bytes(out)

    def _page(self, packets: list[tuple[bytes, bytes]], granule: int, *, eos: bool) -> bytes:
        flags = (0 if self._started else _FLAG_BOS) | (_FLAG_EOS if eos else 0)
        self._started = True
        lacing = b"".join(lace for _, lace in packets)
        body = b"".join(data for data, _ in packets)
        header = _HEADER.pack(b"OggS", 0, flags, granule, self.serial, self._sequence, 0)
        page = bytearray(header + bytes([len(lacing)]) + lacing + body)
        struct.pack_into("<I", page, 22, ogg_crc(page))
        self._sequence += 1
        self._granule = granule
        return bytes(page)


__all__ = ["OggStreamWriter", "ogg_crc"]
