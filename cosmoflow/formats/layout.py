"""What a CosmoFlow dataset's files hold (:class:`SampleLayout`), what a family reads of a split
(:class:`Selection`), and the order of the targets in them.

Every format module describes the files it recognises with a :class:`SampleLayout`; the pipeline
(``cosmoflow/data.py``) reads samples, selects targets and names problems from it.  The targets' order
comes from the files (``namePar``), else ``data.file_target_names``, else the MLPerf order
(:func:`file_targets`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from common.deferred import tensorflow as tf   # imported at first use: the formats' table is read without it
from common.errors import DataError
from cosmoflow.config import TARGET_NAMES


@dataclasses.dataclass(frozen=True)
class SampleLayout:
    """What a dataset's samples are, told by the files' content: which format, how ``x`` is stored, and
    the targets in file order.  (Picklable: ranks agree on it by exchanging it.)"""

    kind: str                   # the format's NAME: mlperf | float_list | sc18 | raw_hdf5 | split_hdf5
    x_dtype: str                # int16 | float32 | float64 (what the file stores)
    targets: tuple[str, ...]    # the names of y, in file order
    names_from: str             # where that order came from
    file_format: str            # the format in words, for messages ("MLPerf TFRecords (x int16 bytes, y floats)")

    def describe(self) -> str:
        """One line for the log: the data format found and where the target names came from."""
        return f"{self.file_format}; targets in the files: {list(self.targets)} ({self.names_from})"


@dataclasses.dataclass(frozen=True)
class Selection:
    """What a file family reads of a split: its ``items`` (files, (file, crop) pairs, a staged copy's sample
    table), the samples used of them (``count``), their layout, the files left out (``data.on_bad_file: skip``),
    and, for files that are not the config's own (a staged copy, one file to predict), their ``compression``
    and whether they are this rank's already (``staged``)."""

    items: Any
    count: int
    layout: SampleLayout
    problems: tuple[str, ...] = ()
    compression: str | None = None   # "none" | "gzip"; None: data.compression
    staged: bool = False


def sized(values, size: int, fill_dtype):
    """(``values`` when it holds ``size`` elements, else zeros; whether it did): a record of another size
    is flagged for ``cosmoflow.data.check_batch`` to name its file, instead of failing a reshape without a name."""
    ok = tf.equal(tf.size(values), size)
    return tf.cond(ok, lambda: values, lambda: tf.zeros([size], fill_dtype)), ok


CANONICAL_TARGETS = {"omega_m": "Omega_m", "om": "Omega_m", "omegam": "Omega_m", "sigma_8": "sigma_8",
                     "sigma8": "sigma_8", "s8": "sigma_8", "n_s": "n_s", "ns": "n_s", "n_spec": "n_s",
                     "h0": "H0", "h_0": "H0"}


def canonical_targets(names, path: str) -> tuple[str, ...]:
    """``namePar`` spellings (Omega_m, sigma_8, N_spec, H_0, ...) as the suite's target names."""
    out = []
    for name in names:
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name.strip().lower() not in CANONICAL_TARGETS:
            raise DataError(f"{path}: namePar names {name!r}, not one of Omega_m, sigma_8, n_s (N_spec), H0 (H_0)")
        out.append(CANONICAL_TARGETS[name.strip().lower()])
    return tuple(out)


def file_targets(data, count: int, path: str, name_par=None) -> tuple[tuple[str, ...], str]:
    """(target names in file order, where they came from) for a file holding ``count`` targets."""
    if name_par is not None:
        names, source = canonical_targets(name_par, path), "namePar"
        if data.file_target_names is not None and list(names) != list(data.file_target_names):
            raise DataError(f"{path}: namePar gives the targets {list(names)}, data.file_target_names says "
                            f"{data.file_target_names}")
    elif data.file_target_names is not None:
        names, source = tuple(data.file_target_names), "data.file_target_names"
    else:
        names, source = TARGET_NAMES, "the MLPerf order; data.file_target_names sets another"
    if len(names) != count:
        raise DataError(f"{path}: holds {count} targets, but {source} names {len(names)} ({list(names)}); "
                        "set data.file_target_names to the files' order")
    missing = [n for n in data.target_names if n not in names]
    if missing:
        raise DataError(f"{path}: data.target_names asks for {missing}, the files hold {list(names)}")
    if data.target_offset is not None and len(data.target_offset) != count:
        raise DataError(f"{path}: holds {count} targets, data.target_offset / target_scale give "
                        f"{len(data.target_offset)} values")
    return names, source
