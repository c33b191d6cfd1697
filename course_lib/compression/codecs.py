"""Lecture 7: Lossless byte coding after a compressor: none, zlib, zstandard, mgzip (source 000's choice).

A codec pays only when the wire time it saves exceeds the time it takes to encode and decode:
$\\frac{n}{B} > \\frac{n}{B} r + \\frac{n}{v_{enc}} + \\frac{n}{v_{dec}}$ for ratio r and link
rate B. int8 gradients compress well (source 000: 52x after int8) because most values round to
zero: a lossless codec finds the sparsity the quantiser created.

Source 000 ran ``mgzip`` at its defaults, level 9 with 100 MB blocks: about 1.6 MB/s here;
level 1 with 1 MB blocks is hundreds of times faster. So level and block size are settings.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["CODECS", "Codec", "CodecSettings", "make_codec"]


@dataclass(frozen=True)
class CodecSettings:
    """``level`` (None: the codec's fast default), mgzip's ``block_size`` bytes and ``threads``."""

    level: int | None = None
    block_size: int = 1 << 20
    threads: int = 1

    def __post_init__(self) -> None:
        if self.level is not None and not (isinstance(self.level, int) and -7 <= self.level <= 22):
            raise ValueError(
                f"level={self.level!r}: zlib and mgzip take 0..9, zstd -7..22; low levels are "
                "fast (1 is the usual choice for gradients), high ones squeeze a little more"
            )
        if not (isinstance(self.block_size, int) and self.block_size >= 4096):
            raise ValueError(
                f"block_size={self.block_size!r}: give mgzip blocks of at least 4096 bytes "
                "(1 MB is fast; source 000's default, 100 MB, leaves one block and one thread)"
            )
        if not (isinstance(self.threads, int) and self.threads >= 1):
            raise ValueError(f"threads={self.threads!r}: use 1 or more threads")


class Codec:
    """No coding: the bytes go as they are. Subclasses implement ``encode`` and ``decode``."""

    name: ClassVar[str] = "none"
    default_level: ClassVar[int | None] = None

    def __init__(self, settings: CodecSettings | None = None) -> None:
        self.settings = settings or CodecSettings()
        self.level = self.default_level if self.settings.level is None else self.settings.level

    def encode(self, data: bytes | memoryview) -> bytes:
        """Return ``data`` coded."""
        return bytes(data)

    def decode(self, data: bytes | memoryview, raw_size: int) -> bytes:
        """Return the ``raw_size`` bytes that ``data`` codes."""
        return bytes(data)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} level {self.level}>"


class ZlibCodec(Codec):
    """zlib (DEFLATE), single-threaded; level 1 is its fastest."""

    name = "zlib"
    default_level = 1

    def __init__(self, settings: CodecSettings | None = None) -> None:
        super().__init__(settings)
        if not 0 <= self.level <= 9:
            raise ValueError(f"zlib level must be 0..9, got {self.level}")

    def encode(self, data: bytes | memoryview) -> bytes:
        """Return ``data`` deflated at this codec's level."""
        return zlib.compress(data, self.level)

    def decode(self, data: bytes | memoryview, raw_size: int) -> bytes:
        """Return the inflated bytes."""
        return zlib.decompress(data, bufsize=max(raw_size, 1))


class ZstdCodec(Codec):
    """Zstandard (Collet 2016): far faster than DEFLATE at a similar or better ratio."""

    name = "zstd"
    default_level = 1

    def __init__(self, settings: CodecSettings | None = None) -> None:
        super().__init__(settings)
        self._open()

    def _open(self) -> None:
        import zstandard

        self._c = zstandard.ZstdCompressor(level=self.level)
        self._d = zstandard.ZstdDecompressor()

    def encode(self, data: bytes | memoryview) -> bytes:
        """Return one zstd frame holding ``data``."""
        return self._c.compress(data)

    def decode(self, data: bytes | memoryview, raw_size: int) -> bytes:
        """Return the decompressed frame (at most ``raw_size`` bytes)."""
        return self._d.decompress(data, max_output_size=raw_size)

    def __getstate__(self) -> dict:
        """Return the settings: zstd's contexts cannot be pickled (an exchange travels by value)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_c", "_d")}

    def __setstate__(self, state: dict) -> None:
        """Rebuild the contexts from the settings."""
        self.__dict__.update(state)
        self._open()


class MgzipCodec(Codec):
    """Multi-threaded gzip (source 000's ``mgzip``): blocks of ``block_size`` coded in parallel."""

    name = "mgzip"
    default_level = 1

    def __init__(self, settings: CodecSettings | None = None) -> None:
        super().__init__(settings)
        if not 0 <= self.level <= 9:
            raise ValueError(f"mgzip level must be 0..9, got {self.level}")

    def encode(self, data: bytes | memoryview) -> bytes:
        """Return ``data`` as multi-block gzip."""
        import mgzip

        s = self.settings
        return mgzip.compress(
            bytes(data), compresslevel=self.level, thread=s.threads, blocksize=s.block_size
        )

    def decode(self, data: bytes | memoryview, raw_size: int) -> bytes:
        """Return the gunzipped bytes."""
        import mgzip

        return mgzip.decompress(
            bytes(data), thread=self.settings.threads, blocksize=self.settings.block_size
        )


CODECS: dict[str, type[Codec]] = {c.name: c for c in (Codec, ZlibCodec, ZstdCodec, MgzipCodec)}


def make_codec(name: str, **settings: int | None) -> Codec:
    """Return codec ``name`` (``none``, ``zlib``, ``zstd``, ``mgzip``) with ``settings``."""
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; choose one of {', '.join(CODECS)}")
    return CODECS[name](CodecSettings(**settings))
