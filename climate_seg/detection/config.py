"""The semi-supervised detection config schema (SC17 / ExtremeWeather)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, model_validator

from climate_seg.cam5.config import EXTREMEWEATHER_CHANNELS, FULL_GRID, DetectSynthSection
from common.config import MEANING, AppConfig, DataSection, Section

BOX_COLUMNS = ("ymin", "xmin", "ymax", "xmax", "class")   # the order used inside the suite (y: rows)
# The ExtremeWeather writer's column order (hur-detect util.py: [xmin, xmax, ymin, ymax, category] with its x
# along the 768-pixel first image axis): [row min, row max, column min, column max, class].
FILE_BOX_COLUMNS = ("ymin", "ymax", "xmin", "xmax", "class")



class DetectDataSection(DataSection):
    """ExtremeWeather-layout HDF5 files in ``data_dir/{train,validation,test}/``: ``images`` (N, C, H, W),
    ``boxes`` (N, 15, 5) padded with -1, optional ``labeled`` (N,)."""

    grid: tuple[PositiveInt, PositiveInt] = Field(FULL_GRID, description="(H, W) of the images",
                                                  json_schema_extra=MEANING)
    file_channels: list[str] = Field(default_factory=lambda: list(EXTREMEWEATHER_CHANNELS),
                                     description="the files' channel order, by name", json_schema_extra=MEANING)
    channels: list[str] = Field(default_factory=lambda: list(EXTREMEWEATHER_CHANNELS),
                                description="channels fed to the network, selected and ordered by name",
                                json_schema_extra=MEANING)
    box_columns: list[Literal["ymin", "xmin", "ymax", "xmax", "class"]] = Field(
        default_factory=lambda: list(FILE_BOX_COLUMNS),
        description="meaning of the 5 columns of boxes (y: rows, the first image axis); default: the "
                    "ExtremeWeather writer's [row min, row max, column min, column max, class]",
        json_schema_extra=MEANING)
    box_classes: Literal["auto", "0-3", "1-4"] = Field(
        "auto", description="class numbering of the files: 0-3 (hur-detect keras-tf) or 1-4 (its older master); "
                            "auto: told by the training boxes (an error when they cannot tell)",
        json_schema_extra=MEANING)
    normalization: Literal["minmax", "zscore"] = Field("zscore", json_schema_extra=MEANING)
    stats_file: str = Field("stats.h5", description="per-channel statistics (file channel order), in data_dir")
    labeled_fraction: float = Field(1.0, gt=0.0, le=1.0,
                                    description="keep labels on this fraction of the labeled training samples "
                                                "(seeded); the rest become unlabeled (experiments)")
    unlabeled_samples: list[NonNegativeInt] = Field(
        default_factory=list, description="training samples (global index, file name order) treated as unlabeled")
    use_unlabeled: bool = Field(True, description="false: drop unlabeled samples (the supervised baseline)")
    labeled_per_batch: NonNegativeInt | None = Field(
        None, description="labeled samples in each batch of data.batch_size (the rest unlabeled); "
                          "default: batch_size / 2 when unlabeled data is used")
    synth: DetectSynthSection = Field(default_factory=DetectSynthSection)

    @model_validator(mode="after")
    def _names(self):
        unknown = [c for c in self.channels if c not in self.file_channels]
        if unknown:
            raise ValueError(f"data.channels {unknown} are not in data.file_channels")
        if sorted(self.box_columns) != sorted(BOX_COLUMNS):
            raise ValueError(f"data.box_columns must name each of {list(BOX_COLUMNS)} once")
        if self.labeled_per_batch is not None and self.labeled_per_batch > self.batch_size:
            raise ValueError(f"data.labeled_per_batch={self.labeled_per_batch} > data.batch_size={self.batch_size}")
        return self


class DetectModelSection(Section):
    """Encoder-decoder with a one-box-per-cell head on the bottleneck (Racah et al. 2017)."""

    variant: Literal["2d", "3d"] = "2d"
    filters: list[PositiveInt] = Field(default_factory=lambda: [128, 256, 512, 768, 1024, 1280],
                                       description="encoder convs, stride 2 each: cell = 2 ** len(filters) px")
    kernel_size: PositiveInt = 5
    leaky_relu_slope: NonNegativeFloat = 0.1
    bottleneck_batch_norm: bool = True
    head_kernel_size: PositiveInt = 3
    time_steps: PositiveInt = Field(8, description="3d: consecutive snapshots per sample")
    time_kernel_size: PositiveInt = Field(3, description="3d: kernel extent in time (stride 1)")
    weight_decay: NonNegativeFloat = Field(5e-4, description="L2 on the kernels")
    head_level: PositiveInt | None = Field(
        None, description="the encoder level the box head works at: cells of 2 ** head_level px, the bottleneck "
                          "upsampled onto that level's features (finer cells for objects smaller than the "
                          "bottleneck's); default: the bottleneck itself")

    @model_validator(mode="after")
    def _head_level_in_encoder(self):
        if self.head_level is not None and self.head_level > len(self.filters):
            raise ValueError(f"head_level {self.head_level} is deeper than the {len(self.filters)} encoder levels")
        return self

    @property
    def cell(self) -> int:
        """Input pixels per side of one box-grid cell (2 to the number of downsampling levels to the head)."""
        return 2 ** (self.head_level or len(self.filters))


class DetectLossSection(Section):
    coord_xy: NonNegativeFloat = 5.0
    coord_wh: NonNegativeFloat = 7.0
    no_object: NonNegativeFloat = 0.5
    lambda_ae: NonNegativeFloat = Field(10.0, description="weight of the reconstruction MSE (0: supervised only)")


class DetectEvalSection(Section):
    score_threshold: float = Field(0.05, ge=0.0, le=1.0, description="p(object) x p(class) to keep a box")
    nms_iou: float = Field(0.3, gt=0.0, le=1.0)


class DetectConfig(AppConfig):
    # Marked MEANING (common.config), checked on resume: what each input channel is (data.channels, picked by
    # name from data.file_channels), the input transform (data.normalization), the grid the boxes' pixel
    # positions and sizes are on (data.grid: predict takes only fields on it), and what the box targets are
    # (data.box_columns: which column is a row or a column edge; data.box_classes: which class each number is).
    task: Literal["detection"]
    data: DetectDataSection
    model: DetectModelSection = Field(default_factory=DetectModelSection)
    loss: DetectLossSection = Field(default_factory=DetectLossSection)
    evaluation: DetectEvalSection = Field(default_factory=DetectEvalSection)
