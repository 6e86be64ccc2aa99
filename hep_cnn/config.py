"""The HEP CNN config schema: the shared sections plus ``data`` and ``model``."""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from common.config import MEANING, AppConfig, CountedDataSection, Section

# The files of each split, told by a word in their names (data.split: by_name).
SPLIT_NAMES = {"train": ("train",), "validation": ("val",), "test": ("test",)}

log = logging.getLogger(__name__)


class SynthSection(Section):
    """Synthetic events written by ``python -m hep_cnn.synth`` (and by train when missing)."""

    generate_if_missing: bool = False
    n_train: PositiveInt = 4000
    n_validation: PositiveInt = 1000
    n_test: PositiveInt = 2000
    signal_fraction: float = Field(0.5, gt=0.0, lt=1.0)
    events_per_file: PositiveInt = 1000
    seed: NonNegativeInt = Field(2017, description="NumPy seed of every file (a whole number of at least 0)")


class HepDataSection(CountedDataSection):
    layout: Literal["auto", "all_events", "benchmark"] = Field(
        "auto", description="file layout; auto: told by each file's datasets (all_events/ group or root data)")
    image_size: PositiveInt = Field(64, description="eta x phi bins (64: |eta| < 2.5; 224: |eta| < 5)",
                                    json_schema_extra=MEANING)
    channels: Literal[1, 3] = Field(3, description="1: calorimeter energy; 3: + EM energy + track count",
                                    json_schema_extra=MEANING)
    split: Literal["by_name", "fractions"] = Field(
        "by_name", description="files named *train*/*val*/*test*, or one event list cut by data.fractions")
    fractions: tuple[PositiveFloat, PositiveFloat, PositiveFloat] = (0.8, 0.1, 0.1)
    chunk_size: PositiveInt = Field(256, description="events per HDF5 read")
    shuffle_buffer: NonNegativeInt = Field(2048, description="events in the shuffle buffer after reading")
    scale_by_maxima: bool = Field(True, description="divide each channel by its training-set maximum",
                                  json_schema_extra=MEANING)
    maxima_file: str = Field("channel_maxima.json", description="written into data.derived_dir by python -m hep_cnn.maxima")
    weight_normalization: Literal["none", "max", "log1p"] = Field(
        "max", description="event weights: none, divided by the training maximum, or log1p")
    augment: bool = Field(False, description="random eta flip and phi roll (the detector is symmetric)")
    synth: SynthSection = Field(default_factory=SynthSection)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, values):
        """``weight_normalisation`` (the old spelling) still read, with a warning: one spelling, as in
        ``climate_seg``'s ``data.normalization``."""
        if isinstance(values, dict) and "weight_normalisation" in values:
            if "weight_normalization" in values:
                raise ValueError("data.weight_normalisation is the old name of data.weight_normalization: "
                                 "give only data.weight_normalization")
            log.warning("data.weight_normalisation is deprecated: call it data.weight_normalization")
            values = dict(values)
            values["weight_normalization"] = values.pop("weight_normalisation")
        return values

    @model_validator(mode="after")
    def _fractions_sum_to_one(self):
        if abs(sum(self.fractions) - 1.0) > 1e-6:
            raise ValueError(f"data.fractions must sum to 1, got {list(self.fractions)}")
        return self


class HepModelSection(Section):
    name: Literal["hep_cnn"] = "hep_cnn"
    conv_units: PositiveInt = Field(3, description="units of Conv -> ReLU -> MaxPool -> Dropout")
    filters: PositiveInt = 128
    kernel_size: PositiveInt = 3
    final_conv: bool = Field(False, description="one more Conv -> ReLU after the units (224 benchmark)")
    head: Literal["global_average", "dense"] = "dense"
    dense_units: PositiveInt = 512
    dropout: float = Field(0.5, ge=0.0, lt=1.0)
    output: Literal["softmax", "sigmoid"] = "softmax"


class HepLossSection(Section):
    weighted: bool = Field(False, description="weight the cross-entropy by the (normalised) event weights")


class HepConfig(AppConfig):
    # Marked MEANING (common.config), checked on resume: what a pixel covers of the detector (data.image_size:
    # 64 bins span |eta| < 2.5, 224 span |eta| < 5), what each input channel is (data.channels) and the input
    # transform (data.scale_by_maxima).  Not data.weight_normalization: it rescales the event weights only the
    # loss uses (loss.weighted), a training choice like the learning rate; the evaluation weighs by the raw ones.
    data: HepDataSection
    model: HepModelSection = Field(default_factory=HepModelSection)
    loss: HepLossSection = Field(default_factory=HepLossSection)
