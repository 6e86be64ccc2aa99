"""Checking TFRecord files without TensorFlow reading every byte.

A record is: uint64 length, uint32 masked CRC-32C of the length, the data,
uint32 masked CRC-32C of the data.  :func:`scan_tfrecord` walks the length
headers (12 bytes per record plus a seek), so a truncated file or a corrupt
header is found at start-up for the price of one small read per record;
``verify_data=True`` also checks every data CRC (what ``common.tools.check_data``
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


def scan_tfrecord(path: str, compression: str = "none", verify_data: bool = False,
                  lengths: list | None = None) -> int:
    """Number of records in ``path``; :class:`DataError` naming the file when it is truncated or corrupt.

    ``lengths``: a list that receives each record's data length (from its header).
    """
    try:
        if compression == "gzip":
            return _scan_stream(path, gzip.open(path, "rb"), verify_data, seekable=False, lengths=lengths)
        return _scan_stream(path, open(path, "rb"), verify_data, seekable=True, lengths=lengths)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: not a readable {'GZIP ' if compression == 'gzip' else ''}TFRecord file ({exc})") from None


def read_records(path: str, compression: str = "none"):
    """Each record's data (bytes) of ``path``, checksums verified, read without TensorFlow."""
    opener = gzip.open if compression == "gzip" else open
    try:
        with opener(path, "rb") as handle:
            index = 0
            while header := handle.read(12):
                if len(header) < 12:
                    raise DataError(f"{path}: truncated TFRecord file (partial header of record {index})")
                length, length_crc = struct.unpack("<QI", header)
                if masked_crc32c(header[:8]) != length_crc:
                    raise DataError(f"{path}: corrupt TFRecord file (bad length checksum of record {index})")
                payload, footer = handle.read(length), handle.read(4)
                if len(payload) < length or len(footer) < 4:
                    raise DataError(f"{path}: truncated TFRecord file (record {index} is cut short)")
                if masked_crc32c(payload) != struct.unpack("<I", footer)[0]:
                    raise DataError(f"{path}: corrupt TFRecord file (bad data checksum of record {index})")
                yield payload
                index += 1
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: not a readable {'GZIP ' if compression == 'gzip' else ''}TFRecord file, corrupt or "
                        f"truncated ({exc})") from None


def first_bad_file(paths, compression: str = "none") -> DataError | None:
    """The :class:`DataError` of the first of ``paths`` that does not read back whole (every checksum
    verified), or None: what names the file after TensorFlow's reader failed without naming it."""
    for path in paths:
        try:
            scan_tfrecord(path, compression, verify_data=True)
        except DataError as exc:
            return exc
    return None


def _scan_stream(path, handle, verify_data: bool, seekable: bool, lengths: list | None = None) -> int:
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
            if lengths is not None:
                lengths.append(length)
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
