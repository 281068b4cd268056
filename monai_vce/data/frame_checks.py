"""Checks of frame image files before they are decoded: regular file, size, PNG structure and CRC-32, declared
pixel count; then Pillow decoding. Needs numpy and Pillow only.
"""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np

from monai_vce.utils import open_regular_file

__all__ = [
    "MAX_FRAME_BYTES",
    "MAX_FRAME_PIXELS",
    "PNG_SIGNATURE",
    "JPEG_SIGNATURE",
    "check_pixels",
    "check_png",
    "image_size",
    "decode_rgb",
    "read_frame_bytes",
]

#: Largest frame accepted by default, in pixels (4096 x 4096; capsule frames are 320-576 pixels wide). A larger
#: frame is refused from its header, before decoding; pass ``max_pixels`` to the loader to accept more.
MAX_FRAME_PIXELS: int = 4096 * 4096
#: Largest frame file read, in bytes (an uncompressed 4096 x 4096 RGB PNG is 48 MiB).
MAX_FRAME_BYTES: int = 256 * 1024**2
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"

# PNG IHDR colour types (PNG spec, section 11.2.2)
_COLOR_TYPES = {0: "grayscale", 2: "rgb", 3: "palette", 4: "grayscale+alpha", 6: "rgba"}
# JPEG start-of-frame markers (they carry the image size): SOF0-SOF15 except DHT (C4), JPG (C8) and DAC (CC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def check_pixels(width: int, height: int, path: str | os.PathLike, max_pixels: int | None = None) -> None:
    """Refuse a frame whose declared size is empty or larger than ``max_pixels`` (default :data:`MAX_FRAME_PIXELS`).

    Raises:
        ValueError: naming the file, its size and the limit.
    """
    limit = MAX_FRAME_PIXELS if max_pixels is None else int(max_pixels)
    if width <= 0 or height <= 0:
        raise ValueError(f"frame {path} declares an empty image ({width} x {height} pixels): the file is corrupted")
    if width * height > limit:
        raise ValueError(
            f"frame {path} declares {width} x {height} pixels, more than the limit of {limit:,} pixels "
            "(a damaged or hostile file, or frames far larger than capsule frames; pass max_pixels to accept it)"
        )


def check_png(data: bytes, path: str | os.PathLike, max_pixels: int | None = None) -> tuple[int, str]:
    """Check a whole PNG file: its header, every chunk up to ``IEND`` with its CRC-32, and its pixel count.

    Args:
        data: the file's bytes (starting with the PNG signature).
        path: the file, named in messages.
        max_pixels: the pixel limit (default :data:`MAX_FRAME_PIXELS`).

    Returns:
        ``(bit depth, colour type name)`` of the image.

    Raises:
        ValueError: a truncated file, a chunk whose CRC does not match its content (a flipped bit), a missing
            ``IEND``, or too many pixels; the message names the file.
    """
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise ValueError(f"truncated or corrupted PNG frame {path}: no complete IHDR header ({len(data)} bytes)")
    width, height = struct.unpack(">II", data[16:24])
    check_pixels(width, height, path, max_pixels)
    view = memoryview(data)
    pos, size = 8, len(data)
    while True:
        if pos + 12 > size:
            raise ValueError(f"truncated or corrupted PNG frame {path}: it ends at byte {size}, before its last chunk")
        length = int.from_bytes(view[pos : pos + 4], "big")
        end = pos + 12 + length
        if end > size:
            kind = bytes(view[pos + 4 : pos + 8]).decode("latin-1")
            raise ValueError(
                f"truncated or corrupted PNG frame {path}: chunk {kind!r} at byte {pos} runs past the end of the file"
            )
        if zlib.crc32(view[pos + 4 : end - 4]) != int.from_bytes(view[end - 4 : end], "big"):
            kind = bytes(view[pos + 4 : pos + 8]).decode("latin-1")
            raise ValueError(
                f"truncated or corrupted PNG frame {path}: CRC mismatch in chunk {kind!r} at byte {pos} (damaged data)"
            )
        if bytes(view[pos + 4 : pos + 8]) == b"IEND":
            return data[24], _COLOR_TYPES.get(data[25], f"colour type {data[25]}")
        pos = end


def image_size(data: bytes, path: str | os.PathLike) -> tuple[int, int]:
    """``(width, height)`` declared by the header of a PNG or JPEG file's bytes, without decoding the image.

    Raises:
        ValueError: the header is missing or truncated, or the content is neither PNG nor JPEG.
    """
    if data.startswith(PNG_SIGNATURE):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ValueError(f"truncated or corrupted PNG frame {path}: no complete IHDR header ({len(data)} bytes)")
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if data.startswith(JPEG_SIGNATURE):
        pos = 2
        while pos + 4 <= len(data):
            if data[pos] != 0xFF:
                break
            marker = data[pos + 1]
            if marker == 0xFF:  # fill byte
                pos += 1
                continue
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
                pos += 2
                continue
            length = int.from_bytes(data[pos + 2 : pos + 4], "big")
            if marker in _SOF:
                if pos + 9 > len(data):
                    break
                height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
                return int(width), int(height)
            pos += 2 + length
        raise ValueError(f"truncated or corrupted JPEG frame {path}: no complete frame header")
    raise ValueError(f"frame {path} is neither a PNG nor a JPEG file (its content starts with another signature)")


def decode_rgb(data: bytes, path: str | os.PathLike, fmt: str, max_pixels: int | None = None) -> np.ndarray:
    """Decode PNG or JPEG bytes to an RGB array ``(H, W, 3)`` (``uint8``; ``uint16`` values for 16-bit grayscale).

    Pillow decodes (it reports damaged data as errors; no decoder here can crash the process). Call
    :func:`check_png` on PNG bytes first: Pillow does not check the CRC of image data.

    Args:
        data: the file's bytes.
        path: the file, named in messages.
        fmt: ``"png"`` or ``"jpeg"``, for messages.
        max_pixels: the pixel limit (default :data:`MAX_FRAME_PIXELS`), checked from the header before decoding.

    Raises:
        ValueError: damaged data, naming the file and the decoder's reason.
    """
    from PIL import Image

    what = "PNG" if fmt == "png" else "JPEG"
    check_pixels(*image_size(data, path), path, max_pixels)  # from the header, before any pixel is decoded
    try:
        with Image.open(io.BytesIO(data)) as im:
            check_pixels(im.size[0], im.size[1], path, max_pixels)
            im.load()
            if im.mode.startswith("I"):  # 16-bit grayscale: PIL's own RGB conversion clips instead of scaling
                a = np.asarray(im, dtype=np.int32).astype(np.uint16)
                return np.repeat(a[..., None], 3, axis=2)
            return np.array(im if im.mode == "RGB" else im.convert("RGB"))
    except ValueError as e:
        if str(path) in str(e):  # the pixel limit: already names the file
            raise
        raise ValueError(f"truncated or corrupted {what} frame {path}: {e}") from None
    except Exception as e:  # Pillow raises OSError, SyntaxError, zlib.error, DecompressionBombError, ...
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ValueError(f"truncated or corrupted {what} frame {path}: {reason}") from None


def read_frame_bytes(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of a frame file: a regular file, read up to ``limit`` bytes (default: all, at most
    :data:`MAX_FRAME_BYTES`).

    A device or a named pipe is refused before a byte is read: a datalist pointing at one would otherwise read
    ``/dev/zero`` until memory runs out, or wait forever on the pipe.

    Raises:
        FileNotFoundError: the file does not exist (the message says when it is a broken link).
        ValueError: a folder, a device, pipe or socket, a file larger than :data:`MAX_FRAME_BYTES`, or unreadable;
            one line naming the file.
    """
    path = os.fspath(path)
    size = MAX_FRAME_BYTES + 1 if limit is None else min(int(limit), MAX_FRAME_BYTES + 1)
    with open_regular_file(path, "frame file", MAX_FRAME_BYTES, too_large="not a capsule frame") as f:
        try:
            return f.read(size)
        except OSError as e:
            raise ValueError(f"frame file {path}: cannot read it ({e.strerror or e})") from None
