"""What CosmoFlow's TFRecord variants share: the file names, the compression, the first record a
dataset's variant is told by, and the size check of a record's parsed values."""

from __future__ import annotations

import tensorflow as tf

from common.errors import DataError

PATTERNS = ("*.tfrecord", "*.tfrecords", "*.tfrecord.gz", "*.tfrecords.gz")


def compression_type(data) -> str:
    """TensorFlow's name for ``data.compression``."""
    return "GZIP" if data.compression == "gzip" else ""


def first_record_features(path: str, data):
    """The features of the first record of ``path`` (a ``tf.train.Example``'s feature map)."""
    try:
        record = next(iter(tf.data.TFRecordDataset(path, compression_type=compression_type(data))))
    except (tf.errors.OpError, StopIteration) as exc:
        raise DataError(f"{path}: no readable first record ({type(exc).__name__})") from None
    return tf.train.Example.FromString(record.numpy()).features.feature


def sized(values, size: int, fill_dtype):
    """(``values`` when it holds ``size`` elements, else zeros; whether it did): a record of another size
    is flagged for ``cosmoflow.data.check_batch`` to name its file, instead of failing a reshape without a name."""
    ok = tf.equal(tf.size(values), size)
    return tf.cond(ok, lambda: values, lambda: tf.zeros([size], fill_dtype)), ok
