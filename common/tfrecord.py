"""Checking TFRecord files without TensorFlow reading every byte.

A record is: uint64 length, uint32 masked CRC-32C of the length, the data,
uint32 masked CRC-32C of the data.  :func:`scan_tfrecord` walks the length
headers (12 bytes per record plus a seek), so a truncated file or a corrupt
header is found at start-up for the price of one small read per record;
``verify_data=True`` also checks every data CRC (what ``common.check_data``
does, with google-crc32c's C implementation).  GZIP files are decompressed as a
stream for the same walk.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib

import google_crc32c

from common.errors import DataError


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C (Castagnoli) of ``data``."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def scan_tfrecord(path: str, compression: str = "none", verify_data: bool = False) -> int:
    """Number of records in ``path``; :class:`DataError` naming the file when it is truncated or corrupt."""
    try:
        if compression == "gzip":
            return _scan_stream(path, gzip.open(path, "rb"), verify_data=True if verify_data else False, seekable=False)
        return _scan_stream(path, open(path, "rb"), verify_data, seekable=True)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: not a readable {'GZIP ' if compression == 'gzip' else ''}TFRecord file ({exc})") from None


def _scan_stream(path, handle, verify_data: bool, seekable: bool) -> int:
    size = os.path.getsize(path) if seekable else None
    count = 0
    with handle:
        while True:
            offset = handle.tell()
            header = handle.read(12)
            if not header:
                return count
            if len(header) < 12:
                raise DataError(f"{path}: truncated TFRecord file (partial header of record {count} at byte {offset})")
            length, length_crc = struct.unpack("<QI", header)
            if masked_crc32c(header[:8]) != length_crc:
                raise DataError(f"{path}: corrupt TFRecord file (bad length checksum of record {count} at byte {offset})")
            if seekable and not verify_data:
                end = offset + 12 + length + 4
                if end > size:
                    raise DataError(f"{path}: truncated TFRecord file (record {count} needs {end} bytes, file has {size})")
                handle.seek(end)
            else:
                payload = handle.read(length)
                footer = handle.read(4)
                if len(payload) < length or len(footer) < 4:
                    raise DataError(f"{path}: truncated TFRecord file (record {count} at byte {offset} is cut short)")
                if verify_data and masked_crc32c(payload) != struct.unpack("<I", footer)[0]:
                    raise DataError(f"{path}: corrupt TFRecord file (bad data checksum of record {count})")
            count += 1
