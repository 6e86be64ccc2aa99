"""SC18 TFRecords (NERSC/CosmoFlow, ``io_Cosmo.py``): ``data_raw`` and ``label_raw`` raw bytes, float32 or
float64 (told by their length), 64^3 single-channel volumes and physical parameter values that
``data.target_offset`` / ``target_scale`` normalise (SC18's zsAVG / zsSTD)."""

from __future__ import annotations

import math

import numpy as np

from common.deferred import tensorflow as tf   # imported at first use: the formats' table is read without it
from common.errors import DataError
from cosmoflow.formats.layout import SampleLayout, file_targets

NAME = "sc18"
FEATURES = "data_raw and label_raw (SC18)"   # what a record needs, for the message when no variant matches
SIZE_UNIT = "bytes"                          # what check_record's message counts x and y in
FILE_FORMAT = "SC18 TFRecords (data_raw, label_raw {x_dtype} bytes)"


def matches(features) -> bool:
    """Whether a first record's features are this variant's."""
    return "data_raw" in features and "label_raw" in features


def layout(features, path: str, data) -> SampleLayout:
    """The layout of a dataset whose first record (``features``, of ``path``) :func:`matches`, its sizes checked."""
    voxels = math.prod(data.sample_shape)
    size = len(features["data_raw"].bytes_list.value[0]) if features["data_raw"].bytes_list.value else 0
    if size not in (4 * voxels, 8 * voxels):
        raise DataError(f"{path}: SC18 record: data_raw holds {size} bytes, expected {voxels} float32 or float64 "
                        f"values (data.sample_shape {list(data.sample_shape)}; SC18: [64, 64, 64, 1])")
    dtype = "float32" if size == 4 * voxels else "float64"
    labels = len(features["label_raw"].bytes_list.value[0]) // np.dtype(dtype).itemsize
    names, source = file_targets(data, labels, path)
    if data.target_offset is None:
        raise DataError(f"{path}: SC18 records hold physical parameter values, not [-1, 1] units; set "
                        "data.target_offset and data.target_scale (SC18's zsAVG and zsSTD)")
    return SampleLayout(NAME, dtype, names, source, FILE_FORMAT.format(x_dtype=dtype))


def parse(record, sample_shape, layout: SampleLayout):
    """(x float32, y float32, whether both had the layout's sizes) of one serialised example."""
    n = len(layout.targets)
    voxels = math.prod(sample_shape)
    features = tf.io.parse_single_example(record, {
        "data_raw": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "label_raw": tf.io.FixedLenFeature([], tf.string, default_value="")})
    dtype = tf.float32 if layout.x_dtype == "float32" else tf.float64
    width = dtype.size
    ok_x = tf.equal(tf.strings.length(features["data_raw"]), width * voxels)
    ok_y = tf.equal(tf.strings.length(features["label_raw"]), width * n)
    x = tf.cond(ok_x, lambda: tf.io.decode_raw(features["data_raw"], dtype), lambda: tf.zeros([voxels], dtype))
    y = tf.cond(ok_y, lambda: tf.io.decode_raw(features["label_raw"], dtype), lambda: tf.zeros([n], dtype))
    return (tf.cast(tf.reshape(x, sample_shape), tf.float32), tf.cast(tf.reshape(y, [n]), tf.float32),
            tf.logical_and(ok_x, ok_y))


def record_sizes(features, layout: SampleLayout, voxels: int) -> tuple[list[int], list[int]]:
    """([x, y] sizes in bytes a record's features hold, [x, y] sizes the layout expects)."""
    width = np.dtype(layout.x_dtype).itemsize
    found = [len(features[k].bytes_list.value[0]) if k in features and features[k].bytes_list.value else 0
             for k in ("data_raw", "label_raw")]
    return found, [width * voxels, width * len(layout.targets)]
