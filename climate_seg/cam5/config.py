"""What the climate tasks share about CAM5 data: the variables, the grid, the label classes, and the
settings of the synthetic data generators."""

from __future__ import annotations

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator

from common.config import Section

# CAM5 variables in the channel order of the training HDF5 files (the SC18 layout).
CHANNELS = ("TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200", "T500", "PRECT", "TS",
            "TREFHT", "Z1000", "Z200", "ZBOT")
CLASS_NAMES = ("background", "cyclone", "river")
FULL_GRID = (768, 1152)
EXTREMEWEATHER_CHANNELS = tuple(sorted(CHANNELS))   # the ExtremeWeather files' (alphabetical) channel order


class SynthSection(Section):
    """CAM5-like fields written by ``python -m climate_seg.cam5.synth`` (and by train when missing)."""

    generate_if_missing: bool = False
    grid: tuple[PositiveInt, PositiveInt] = Field((192, 288), description="(lat, lon) points of the synthetic grid")
    n_train: PositiveInt = 96
    n_validation: PositiveInt = 24
    n_test: PositiveInt = 24
    steps_per_file: PositiveInt = Field(8, description="time steps per netCDF file")
    cyclones_per_step: tuple[NonNegativeInt, NonNegativeInt] = Field((2, 5), description="min, max planted")
    rivers_per_step: tuple[NonNegativeInt, NonNegativeInt] = Field((1, 3), description="min, max planted")
    seed: NonNegativeInt = Field(2018, description="NumPy seed of every file (a whole number of at least 0)")

    @field_validator("cyclones_per_step", "rivers_per_step")
    @classmethod
    def _min_not_above_max(cls, value):
        if value[0] > value[1]:
            raise ValueError("expected [min, max] with min <= max")
        return value


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
    seed: NonNegativeInt = Field(2017, description="NumPy seed of every file (a whole number of at least 0)")
