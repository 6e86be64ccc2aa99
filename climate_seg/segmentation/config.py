"""The climate segmentation config schema: the shared sections plus ``data``, ``model`` and ``loss``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from climate_seg.cam5.config import CHANNELS, CLASS_NAMES, FULL_GRID, SynthSection
from common.config import MEANING, AppConfig, CountedDataSection, Section


class ClimateDataSection(CountedDataSection):
    """HDF5 samples (``climate/data`` H x W x 16, ``climate/labels_0`` H x W) in
    ``data_dir/{train,validation,test}/``, statistics in ``data_dir/stats.h5``."""

    grid: tuple[PositiveInt, PositiveInt] = Field(FULL_GRID, description="(lat, lon) points of the files")
    downsample: PositiveInt = Field(1, description="average-pool the fields, sample the labels, by this factor",
                                    json_schema_extra=MEANING)
    crop: tuple[PositiveInt, PositiveInt] | None = Field(
        None, description="(h, w) after downsampling: random crops in training, centre crops otherwise")
    normalization: Literal["minmax", "zscore"] = Field("minmax", json_schema_extra=MEANING)
    stats_file: str = Field("stats.h5", description="per-channel statistics, relative to data_dir")
    shuffle_buffer: NonNegativeInt = Field(0, description="sample shuffle buffer after reading (0: file shuffle only)")
    augment: bool = Field(False, description="random longitude rolls (the globe is periodic in longitude)")
    read_parallelism: PositiveInt = Field(4, description="files read at once (GIL-free raw reads)")
    stage_dir: str | None = Field(None, description="copy each rank's training files here (node-local SSD, "
                                  "/dev/shm) before training; each rank then keeps its share; $VARIABLES expanded "
                                  "there (/dev/shm/climate_seg-${SLURM_JOB_ID}: a folder per job)")
    synth: SynthSection = Field(default_factory=SynthSection)

    @model_validator(mode="after")
    def _divisible(self):
        h, w = self.grid
        if h % self.downsample or w % self.downsample:
            raise ValueError(f"data.downsample={self.downsample} must divide data.grid {list(self.grid)}")
        if self.crop and (self.crop[0] > h // self.downsample or self.crop[1] > w // self.downsample):
            raise ValueError(f"data.crop {list(self.crop)} is larger than the downsampled grid "
                             f"{[h // self.downsample, w // self.downsample]}")
        return self

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """The network's input (height, width, channels) after downsampling or cropping."""
        h, w = self.grid[0] // self.downsample, self.grid[1] // self.downsample
        if self.crop:
            h, w = self.crop
        return h, w, len(CHANNELS)


class TiramisuSection(Section):
    """FC-DenseNet, the SC18 climate variant."""

    growth_rate: PositiveInt = 32
    kernel_size: PositiveInt = 5
    first_filters: PositiveInt = 64
    down_blocks: list[PositiveInt] = Field(default_factory=lambda: [2, 2, 2, 4])
    bottleneck_layers: PositiveInt = 5
    up_blocks: list[PositiveInt] = Field(default_factory=lambda: [4, 2, 2, 2])
    dropout: float = Field(0.2, ge=0.0, lt=1.0)
    batch_norm: bool = True

    @model_validator(mode="after")
    def _mirrored(self):
        if len(self.up_blocks) != len(self.down_blocks):
            raise ValueError(f"model.tiramisu.up_blocks {self.up_blocks} needs one block per down block "
                             f"({len(self.down_blocks)})")
        return self


class DeeplabSection(Section):
    """DeepLabv3+ on a ResNet-50 v2 (pre-activation) backbone."""

    output_stride: Literal[8, 16] = 8
    blocks: list[PositiveInt] = Field(default_factory=lambda: [3, 4, 6, 3], description="bottleneck units per stage")
    base_filters: PositiveInt = Field(64, description="bottleneck width of stage 1 (doubles per stage; x4 out)")
    aspp_filters: PositiveInt = 256
    atrous_rates: list[PositiveInt] | None = Field(
        None, description="ASPP rates; default (12, 24, 36) at output stride 8, (6, 12, 18) at 16")
    low_level_filters: PositiveInt = 48
    decoder_filters: PositiveInt = 256
    decoder: Literal["bilinear", "deconv", "deconv1x"] = "deconv1x"
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="after the ASPP projection")

    @property
    def rates(self) -> list[int]:
        """The ASPP atrous rates: the configured ones, else DeepLabv3+'s for the output stride."""
        if self.atrous_rates:
            return list(self.atrous_rates)
        return [12, 24, 36] if self.output_stride == 8 else [6, 12, 18]


class ClimateModelSection(Section):
    name: Literal["tiramisu", "deeplab"] = "tiramisu"
    weight_decay: NonNegativeFloat = Field(1e-4, description="L2 on the conv kernels")
    tiramisu: TiramisuSection = Field(default_factory=TiramisuSection)
    deeplab: DeeplabSection = Field(default_factory=DeeplabSection)


class ClimateLossSection(Section):
    """Per-pixel softmax cross-entropy weighted by class."""

    class_weights: Literal["inverse_frequency", "power", "none"] | list[PositiveFloat] = Field(
        "inverse_frequency", description="from the class frequencies in stats.h5, or three numbers")
    weight_power: PositiveFloat = Field(0.125, description="class_weights: power -> weight = frequency^-p")

    @model_validator(mode="after")
    def _three_weights(self):
        if isinstance(self.class_weights, list) and len(self.class_weights) != len(CLASS_NAMES):
            raise ValueError(f"loss.class_weights needs {len(CLASS_NAMES)} numbers {list(CLASS_NAMES)}, "
                             f"got {self.class_weights}")
        return self


class ClimateConfig(AppConfig):
    # Marked MEANING (common.config), checked on resume: the input transform (data.normalization) and the grid
    # points one input and one output pixel stand for (data.downsample: one class per k x k block).  The 16
    # channels are fixed (cam5.config.CHANNELS); data.grid is the files' extent, not the network's (predict
    # tiles fields of any grid), and data.crop only the training window of a fully convolutional network.
    task: Literal["segmentation"] = "segmentation"
    data: ClimateDataSection
    model: ClimateModelSection = Field(default_factory=ClimateModelSection)
    loss: ClimateLossSection = Field(default_factory=ClimateLossSection)
