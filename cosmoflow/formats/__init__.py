"""CosmoFlow's file families, one module each, listed once in :data:`FAMILIES`.

``data.format`` picks a family (its choices are this table's names); within its files the variant is told by
their content, never by their names, and described by a :class:`~cosmoflow.formats.layout.SampleLayout`:

- ``tfrecord``: MLPerf HPC TFRecords (``tfrecord_mlperf``, GZIP too), cosmoflow-benchmark's before 2020
  (``tfrecord_float_list``: ``x`` a float list), NERSC/CosmoFlow SC18's (``tfrecord_sc18``: ``data_raw``,
  ``label_raw``); the copy ``data.stage_decompress`` stages MLPerf's GZIP TFRecords as is ``raw_staged``;
- ``hdf5``: raw universes (``full``, ``unitPar``, cut into crops) and ``prepare.py``'s split crops (``x``, ``y``).

Every family module holds the same protocol, which ``cosmoflow/data.py`` (reading) and ``cosmoflow/mock.py``
(writing) alone call:

==========================================================  ====================================================
``NAME``, ``WHAT``, ``PATTERNS``                             its ``data.format`` value, its name in messages,
                                                             its files' names (the data tools' list too)
``select(cfg, directory, requested, key, dist)``             a split's files listed and screened, their layout,
                                                             the samples used: a ``Selection``
``read(cfg, selection, dist, seed, training)``               this rank's (x as stored, y in file order, file
                                                             name, sizes right) per sample (``rank_share``)
``bad_file_finder(cfg, selection)``                          what names a bad file after a TensorFlow read
                                                             error (None: the reader names it)
``read_targets(cfg, selection, where)``                      the selected samples' targets, in file order
``file_samples(cfg, path, layouts)``                         every (where, x, y, layout) of a file, checked:
                                                             the data checker's walk
``recognises(path)``, ``file_selection(cfg, path)``          one file to predict, told by its content (the
                                                             default family recognises what no other does)
``stage(cfg, selection, dist)`` (optional)                   a training split's copies in ``data.stage_dir``
                                                             (inflated with ``data.stage_decompress``): (the
                                                             family reading them, their ``Selection``)
``input_ceiling(cfg, samples)`` (optional)                   the numpy loop ``bench --input-only`` compares with
``COMPRESSIONS``, ``HOLDS_CROPS``                            the ``data.compression`` values its files are written
                                                             and read in; whether a file holds a volume cut into
                                                             crops (``cosmoflow.mock`` refuses ``--gzip`` and
                                                             ``--crops-per-side`` by these)
``file_name(stem, compression)``                             the name ``cosmoflow.mock`` gives a sample's file
``write_sample(path, x, y, physical, compression)``          one mock universe as a file of this family (x int16
                                                             counts, channels last; y its targets in [-1, 1];
                                                             physical its parameters)
==========================================================  ====================================================

A new family (npy, zarr) is one module here holding that protocol, one line in :data:`FAMILIES`, and its test
in ``tests/test_formats.py``.  A new TFRecord variant is one module like ``tfrecord_float_list.py`` and its line
in ``tfrecord.VARIANTS``.  This module imports none of them: the config reads the table without TensorFlow.
"""

from __future__ import annotations

import importlib

# data.format -> the module of that file family.
FAMILIES = {"tfrecord": "cosmoflow.formats.tfrecord", "hdf5": "cosmoflow.formats.hdf5"}
# data.format's default, and the family of a file no other family recognises (TFRecords carry no signature).
DEFAULT = "tfrecord"


def family(name: str):
    """The module of the family ``name`` (a ``data.format`` value)."""
    return importlib.import_module(FAMILIES[name])


def patterns() -> tuple[str, ...]:
    """Every family's file names: what a CosmoFlow dataset folder holds samples in."""
    return tuple(pattern for name in FAMILIES for pattern in family(name).PATTERNS)


def family_of_file(path: str):
    """The family whose files ``path`` is, told by its content (the default family when no other's signature
    matches)."""
    others = [family(name) for name in FAMILIES if name != DEFAULT]
    return next((module for module in others if module.recognises(path)), family(DEFAULT))


def stages_inflated(name: str, compression: str) -> bool:
    """Whether ``data.stage_decompress`` has files to inflate in the family ``name`` written in ``compression``:
    they are compressed (one of its ``COMPRESSIONS`` other than "none") and the family stages copies (``stage``)."""
    module = family(name)
    return compression != "none" and compression in module.COMPRESSIONS and hasattr(module, "stage")
