"""MLPerf HPC TFRecords (since 2020): one ``tf.train.Example`` per sample, ``x`` the raw bytes of the int16
particle counts of ``data.sample_shape`` (C order, little-endian), ``y`` float32 targets in [-1, 1];
GZIP-compressed files too (``data.compression: gzip``).  ``data.stage_decompress`` stages them as raw
samples (:mod:`cosmoflow.formats.raw_staged`)."""

from __future__ import annotations

import math

from common.deferred import tensorflow as tf   # imported at first use: the formats' table is read without it
from common.errors import DataError
from cosmoflow.formats.layout import SampleLayout, file_targets, sized

NAME = "mlperf"
FEATURES = "x and y (MLPerf)"   # what a record needs, for the message when no variant matches
SIZE_UNIT = "values"            # what check_record's message counts x and y in
FILE_FORMAT = "MLPerf TFRecords (x int16 bytes, y floats)"


def matches(features) -> bool:
    """Whether a first record's features are this variant's."""
    return "x" in features and "y" in features and bool(features["x"].bytes_list.value)


def layout(features, path: str, data) -> SampleLayout:
    """The layout of a dataset whose first record (``features``, of ``path``) :func:`matches`, its sizes checked."""
    voxels = math.prod(data.sample_shape)
    size = len(features["x"].bytes_list.value[0])
    if size != 2 * voxels:
        raise DataError(f"{path}: 'x' holds {size} bytes, expected {2 * voxels} "
                        f"(int16 x data.sample_shape {list(data.sample_shape)})")
    names, source = file_targets(data, len(features["y"].float_list.value), path)
    return SampleLayout(NAME, "int16", names, source, FILE_FORMAT)


def parse(record, sample_shape, layout: SampleLayout):
    """(x int16, y float32, whether both had the layout's sizes) of one serialised example."""
    voxels = math.prod(sample_shape)
    features = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([], tf.string, default_value=""),
                                                   "y": tf.io.VarLenFeature(tf.float32)})
    ok_x = tf.equal(tf.strings.length(features["x"]), 2 * voxels)
    x = tf.cond(ok_x, lambda: tf.io.decode_raw(features["x"], tf.int16), lambda: tf.zeros([voxels], tf.int16))
    y, ok_y = sized(features["y"].values, len(layout.targets), tf.float32)
    return tf.reshape(x, sample_shape), tf.reshape(y, [len(layout.targets)]), tf.logical_and(ok_x, ok_y)


def record_sizes(features, layout: SampleLayout, voxels: int) -> tuple[list[int], list[int]]:
    """([x, y] sizes a record's features hold, [x, y] sizes the layout expects)."""
    found = [len(features["x"].bytes_list.value[0]) if "x" in features and features["x"].bytes_list.value else 0,
             len(features["y"].float_list.value) if "y" in features else 0]
    return found, [2 * voxels, len(layout.targets)]
