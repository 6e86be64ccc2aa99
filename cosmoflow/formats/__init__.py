"""CosmoFlow's on-disk formats, one module each, listed once here.

``data.format`` picks the files (``tfrecord`` or ``hdf5``); within them the variant is told by their
content, never by their names, and described by a :class:`~cosmoflow.formats.layout.SampleLayout`
that the pipeline (``cosmoflow/data.py``) reads samples by:

- ``tfrecord_mlperf``: MLPerf HPC TFRecords (``x`` int16 bytes, ``y`` floats), GZIP too;
- ``tfrecord_float_list``: cosmoflow-benchmark's before 2020 (``x`` a float list);
- ``tfrecord_sc18``: NERSC/CosmoFlow SC18's (``data_raw``, ``label_raw`` float32 or float64 bytes);
- ``hdf5``: raw universes (``full``, ``unitPar``, cut into crops) and ``prepare.py``'s split crops (``x``, ``y``);
- ``raw_staged``: the copy ``data.stage_decompress`` stages MLPerf's GZIP TFRecords as.

``layout`` (the description and the target order) and ``tfrecord`` (what the TFRecord variants share) serve
them.  A new TFRecord variant is one module like ``tfrecord_float_list.py`` (``NAME``, ``FEATURES``,
``SIZE_UNIT``, ``matches``, ``layout``, ``parse``, ``record_sizes``), one line in
:data:`TFRECORD_VARIANTS`, and its test in ``tests/test_formats.py``: files written there with
TensorFlow's own writer, the values the network sees checked against numpy.
"""

from __future__ import annotations

from common.errors import DataError
from cosmoflow.formats import hdf5, raw_staged, tfrecord, tfrecord_float_list, tfrecord_mlperf, tfrecord_sc18
from cosmoflow.formats.layout import SampleLayout

# data.format -> the names of its files.
FILE_PATTERNS = {"tfrecord": tfrecord.PATTERNS, "hdf5": hdf5.PATTERNS}
# data.format: tfrecord: the variants, tried in this order against the first record of a split; the first
# that matches is the split's.
TFRECORD_VARIANTS = (tfrecord_mlperf, tfrecord_float_list, tfrecord_sc18)
# The staged copy data.stage_decompress writes of a TFRecord variant (its staged_format, sample_table and
# read_samples); the others are staged as inflated TFRecords.
STAGED_AS = {tfrecord_mlperf.NAME: raw_staged}


def record_layout(path: str, cfg) -> SampleLayout:
    """The layout of a TFRecord dataset, from the first record of one of its files."""
    features = tfrecord.first_record_features(path, cfg.data)
    for variant in TFRECORD_VARIANTS:
        if variant.matches(features):
            return variant.layout(features, path, cfg.data)
    needs = " or ".join(dict.fromkeys(variant.FEATURES for variant in TFRECORD_VARIANTS))
    raise DataError(f"{path}: records need features {needs}, found {sorted(features)}")


def tfrecord_variant(layout: SampleLayout):
    """The module of the TFRecord variant ``layout`` describes."""
    return next(variant for variant in TFRECORD_VARIANTS if variant.NAME == layout.kind)

