"""The climate segmentation config schema: the shared sections plus ``data``, ``model`` and ``loss``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from common.config import AppConfig, DataSection, Section

# CAM5 variables in the channel order of the training HDF5 files (the SC18 layout).
CHANNELS = ("TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200", "T500", "PRECT", "TS",
            "TREFHT", "Z1000", "Z200", "ZBOT")
CLASS_NAMES = ("background", "cyclone", "river")
FULL_GRID = (768, 1152)


class SynthSection(Section):
    """CAM5-like fields written by ``python -m climate_seg.synth`` (and by train when missing)."""

    generate_if_missing: bool = False
    grid: tuple[PositiveInt, PositiveInt] = Field((192, 288), description="(lat, lon) points of the synthetic grid")
    n_train: PositiveInt = 96
    n_validation: PositiveInt = 24
    n_test: PositiveInt = 24
    steps_per_file: PositiveInt = Field(8, description="time steps per netCDF file")
    cyclones_per_step: tuple[NonNegativeInt, NonNegativeInt] = Field((2, 5), description="min, max planted")
    rivers_per_step: tuple[NonNegativeInt, NonNegativeInt] = Field((1, 3), description="min, max planted")
    seed: int = 2018


class ClimateDataSection(DataSection):
    """HDF5 samples (``climate/data`` H x W x 16, ``climate/labels_0`` H x W) in
    ``data_dir/{train,validation,test}/``, statistics in ``data_dir/stats.h5``."""

    grid: tuple[PositiveInt, PositiveInt] = Field(FULL_GRID, description="(lat, lon) points of the files")
    downsample: PositiveInt = Field(1, description="average-pool the fields, sample the labels, by this factor")
    crop: tuple[PositiveInt, PositiveInt] | None = Field(
        None, description="(h, w) after downsampling: random crops in training, centre crops otherwise")
    normalization: Literal["minmax", "zscore"] = "minmax"
    stats_file: str = Field("stats.h5", description="per-channel statistics, relative to data_dir")
    n_train: PositiveInt | None = Field(None, description="training samples to use (default: all present)")
    n_validation: PositiveInt | None = None
    shuffle_buffer: NonNegativeInt = Field(0, description="sample shuffle buffer after reading (0: file shuffle only)")
    augment: bool = Field(False, description="random longitude rolls (the globe is periodic in longitude)")
    read_parallelism: PositiveInt = Field(4, description="files read at once (GIL-free raw reads)")
    stage_dir: str | None = Field(None, description="copy each rank's training files here (node-local SSD, "
                                  "/dev/shm) before training; each rank then keeps its share")
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
    task: Literal["segmentation"] = "segmentation"
    data: ClimateDataSection
    model: ClimateModelSection = Field(default_factory=ClimateModelSection)
    loss: ClimateLossSection = Field(default_factory=ClimateLossSection)


# -- semi-supervised detection (SC17 / ExtremeWeather) --------------------------------------------

EXTREMEWEATHER_CHANNELS = tuple(sorted(CHANNELS))   # the ExtremeWeather files' (alphabetical) channel order
BOX_COLUMNS = ("ymin", "xmin", "ymax", "xmax", "class")   # the order used inside the suite (y: rows)
# The ExtremeWeather writer's column order (hur-detect util.py: [xmin, xmax, ymin, ymax, category] with its x
# along the 768-pixel first image axis): [row min, row max, column min, column max, class].
FILE_BOX_COLUMNS = ("ymin", "ymax", "xmin", "xmax", "class")


class DetectSynthSection(Section):
    """Synthetic snapshots with the four event classes, written in the ExtremeWeather layout."""

    generate_if_missing: bool = False
    grid: tuple[PositiveInt, PositiveInt] = Field((128, 192), description="(lat, lon) points")
    n_train: PositiveInt = 192
    n_validation: PositiveInt = 32
    n_test: PositiveInt = 48
    samples_per_file: PositiveInt = Field(64, description="snapshots per HDF5 file")
    unlabeled_every: NonNegativeInt = Field(
        2, description="every n-th training snapshot is written without boxes (ExtremeWeather labels every "
                       "other 3-hourly step); 0: all labeled")
    seed: int = 2017


class DetectDataSection(DataSection):
    """ExtremeWeather-layout HDF5 files in ``data_dir/{train,validation,test}/``: ``images`` (N, C, H, W),
    ``boxes`` (N, 15, 5) padded with -1, optional ``labeled`` (N,)."""

    grid: tuple[PositiveInt, PositiveInt] = Field(FULL_GRID, description="(H, W) of the images")
    file_channels: list[str] = Field(default_factory=lambda: list(EXTREMEWEATHER_CHANNELS),
                                     description="the files' channel order, by name")
    channels: list[str] = Field(default_factory=lambda: list(EXTREMEWEATHER_CHANNELS),
                                description="channels fed to the network, selected and ordered by name")
    box_columns: list[Literal["ymin", "xmin", "ymax", "xmax", "class"]] = Field(
        default_factory=lambda: list(FILE_BOX_COLUMNS),
        description="meaning of the 5 columns of boxes (y: rows, the first image axis); default: the "
                    "ExtremeWeather writer's [row min, row max, column min, column max, class]")
    box_classes: Literal["auto", "0-3", "1-4"] = Field(
        "auto", description="class numbering of the files: 0-3 (hur-detect keras-tf) or 1-4 (its older master); "
                            "auto: told by the training boxes (an error when they cannot tell)")
    normalization: Literal["minmax", "zscore"] = "zscore"
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

    @property
    def cell(self) -> int:
        return 2 ** len(self.filters)


class DetectLossSection(Section):
    coord_xy: NonNegativeFloat = 5.0
    coord_wh: NonNegativeFloat = 7.0
    no_object: NonNegativeFloat = 0.5
    lambda_ae: NonNegativeFloat = Field(10.0, description="weight of the reconstruction MSE (0: supervised only)")


class DetectEvalSection(Section):
    score_threshold: float = Field(0.05, ge=0.0, le=1.0, description="p(object) x p(class) to keep a box")
    nms_iou: float = Field(0.3, gt=0.0, le=1.0)


class DetectConfig(AppConfig):
    task: Literal["detection"]
    data: DetectDataSection
    model: DetectModelSection = Field(default_factory=DetectModelSection)
    loss: DetectLossSection = Field(default_factory=DetectLossSection)
    evaluation: DetectEvalSection = Field(default_factory=DetectEvalSection)
