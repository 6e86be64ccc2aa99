"""TFRecords of cosmoflow-benchmark before March 2020 (commit bb8bc51): as MLPerf's, but ``x`` stored as a
float list, not as int16 bytes."""

from __future__ import annotations

import math

from common.deferred import tensorflow as tf   # imported at first use: the formats' table is read without it
from common.errors import DataError
from cosmoflow.formats.layout import SampleLayout, file_targets, sized

NAME = "float_list"
FEATURES = "x and y (MLPerf)"   # what a record needs, for the message when no variant matches
SIZE_UNIT = "values"            # what check_record's message counts x and y in
FILE_FORMAT = "TFRecords with x as a float list (cosmoflow-benchmark before 2020)"


def matches(features) -> bool:
    """Whether a first record's features are this variant's."""
    return "x" in features and "y" in features and not features["x"].bytes_list.value


def layout(features, path: str, data) -> SampleLayout:
    """The layout of a dataset whose first record (``features``, of ``path``) :func:`matches`, its sizes checked."""
    voxels = math.prod(data.sample_shape)
    size = len(features["x"].float_list.value)
    if size != voxels:
        raise DataError(f"{path}: 'x' holds {size} floats, expected {voxels} "
                        f"(data.sample_shape {list(data.sample_shape)})")
    names, source = file_targets(data, len(features["y"].float_list.value), path)
    return SampleLayout(NAME, "float32", names, source, FILE_FORMAT)


def parse(record, sample_shape, layout: SampleLayout):
    """(x float32, y float32, whether both had the layout's sizes) of one serialised example."""
    features = tf.io.parse_single_example(record, {"x": tf.io.VarLenFeature(tf.float32),
                                                   "y": tf.io.VarLenFeature(tf.float32)})
    x, ok_x = sized(features["x"].values, math.prod(sample_shape), tf.float32)
    y, ok_y = sized(features["y"].values, len(layout.targets), tf.float32)
    return tf.reshape(x, sample_shape), tf.reshape(y, [len(layout.targets)]), tf.logical_and(ok_x, ok_y)


def record_sizes(features, layout: SampleLayout, voxels: int) -> tuple[list[int], list[int]]:
    """([x, y] sizes a record's features hold, [x, y] sizes the layout expects)."""
    found = [len(features["x"].float_list.value) if "x" in features else 0,
             len(features["y"].float_list.value) if "y" in features else 0]
    return found, [voxels, len(layout.targets)]
