"""Climate segmentation and detection on the engine's epoch (common/loop/epochs.py): the evaluation walk is every
sample of a split once, in file order (checked against the files read with h5py); two ranks' training epochs
take disjoint samples that cover the split; the counts' errors name the key and the folder."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from climate_seg.cam5.config import EXTREMEWEATHER_CHANNELS
from climate_seg.cam5.stats import compute_stats, write_stats
from climate_seg.detection import data as detection
from climate_seg.detection.boxes import TARGET_CHANNELS
from climate_seg.detection.config import DetectConfig
from climate_seg.segmentation import data as segmentation
from climate_seg.segmentation.config import ClimateConfig
from common.distributed import Distributed
from common.errors import DataError

GRID = (16, 24)
RNG = np.random.default_rng(47)


def rank_of(rank: int, size: int) -> Distributed:
    """One rank of ``size`` played in this process (the data's sharding only; no collective is called)."""
    stand_in = Distributed()
    stand_in.rank, stand_in.size = rank, size
    return stand_in


# -- segmentation ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def climate_files(tmp_path_factory):
    """DeepCAM-layout samples (one per file, labels drawn at random so that each sample is told by them):
    6 train, 3 validation, 5 test; stats.h5 over the training files.  {split: [(fields, labels), ...]}."""
    root = tmp_path_factory.mktemp("climate-splits")
    written = {}
    for split, count in (("train", 6), ("validation", 3), ("test", 5)):
        (root / split).mkdir()
        written[split] = []
        for i in range(count):
            fields = RNG.normal(size=(*GRID, 16)).astype(np.float32) * (1 + np.arange(16, dtype=np.float32))
            labels = RNG.integers(0, 3, size=GRID).astype(np.int32)
            with h5py.File(root / split / f"sample-{i:03d}.h5", "w") as f:
                f["climate/data"], f["climate/labels_0"] = fields, labels
            written[split].append((fields, labels))
    write_stats(root / "stats.h5", compute_stats(sorted(str(p) for p in (root / "train").glob("*.h5"))))
    return root, written


def climate_cfg(root, **data) -> ClimateConfig:
    return ClimateConfig(data={"data_dir": str(root), "grid": list(GRID), "batch_size": 2, **data}, train={"seed": 3})


@pytest.mark.parametrize("split", ["test", "validation"])
def test_segmentation_evaluation_walk_is_every_file_once_in_name_order(climate_files, split):
    root, written = climate_files
    dataset, names = segmentation.evaluation_dataset(climate_cfg(root), split)
    batches = [(x.numpy(), y.numpy()) for x, y in dataset]
    assert [len(x) for x, _ in batches] == [2] * (len(written[split]) // 2) + [1] * (len(written[split]) % 2)
    assert names == [str(root / split / f"sample-{i:03d}.h5") for i in range(len(written[split]))]
    # The reference: each file read with h5py, normalised min-max over every training pixel.
    pixels = np.concatenate([fields.reshape(-1, 16) for fields, _ in written["train"]])
    low, high = pixels.min(0), pixels.max(0)
    fields = np.concatenate([x for x, _ in batches])
    labels = np.concatenate([y for _, y in batches])
    for k, path in enumerate(names):
        with h5py.File(path) as f:
            np.testing.assert_allclose(fields[k], (f["climate/data"][()] - low) / (high - low), rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(labels[k], f["climate/labels_0"][()])


@pytest.mark.parametrize("staged", [False, True])
def test_segmentation_two_ranks_epochs_take_disjoint_samples_covering_the_split(climate_files, tmp_path, staged):
    root, written = climate_files
    extra = {"stage_dir": str(tmp_path / "stage")} if staged else {}
    cfg = climate_cfg(root, batch_size=1, shuffle_buffer=3, **extra)
    every = {labels.tobytes() for _, labels in written["train"]}
    for epoch in (0, 1):
        shares = []
        for rank in (0, 1):
            datasets = segmentation.build_datasets(cfg, rank_of(rank, 2))
            assert (datasets.steps_per_epoch, datasets.global_batch_size, datasets.train_samples) == (3, 2, 6)
            shares.append([y.numpy()[0].tobytes() for _, y in datasets.train_epoch(epoch).take(4)])
        assert [len(share) for share in shares] == [3, 3], "an epoch is steps_per_epoch batches, then ends"
        assert not set(shares[0]) & set(shares[1]), "the ranks' shares overlap"
        assert set(shares[0]) | set(shares[1]) == every, "an epoch of both ranks leaves samples out"


def test_segmentation_counts_errors_name_the_key_and_the_folder(climate_files, tmp_path):
    root, _ = climate_files
    with pytest.raises(DataError, match=rf"^{root}/train: 6 samples cannot fill one batch of 4 on each of 2 ranks "
                                        r"\(lower data.batch_size"):
        segmentation.build_datasets(climate_cfg(root, batch_size=4), rank_of(0, 2))
    with pytest.raises(DataError, match=rf"^{root}/validation: 3 samples .* batch of 2 on each of 2 ranks"):
        segmentation.build_datasets(climate_cfg(root), rank_of(0, 2))
    with pytest.raises(DataError, match=r"data\.n_train") as raised:
        segmentation.build_datasets(climate_cfg(root, n_train=7), Distributed())
    assert f"{root}/train" in str(raised.value)
    # Checked before the copy: nothing is staged for a batch the data cannot fill.
    stage = tmp_path / "stage"
    with pytest.raises(DataError, match="data.batch_size"):
        segmentation.build_datasets(climate_cfg(root, batch_size=7, stage_dir=str(stage)), Distributed())
    assert not stage.exists()


# -- detection -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def detection_files(tmp_path_factory):
    """ExtremeWeather-layout files: snapshot k of the data set has every value k (told apart after the
    normalisation by its order), a box on every labeled snapshot, every third training snapshot unlabeled."""
    root = tmp_path_factory.mktemp("detection-splits")
    snapshot = 0
    for split, files in (("train", (5, 4)), ("validation", (4, 2)), ("test", (3, 2))):
        (root / split).mkdir()
        for i, count in enumerate(files):
            labeled = np.array([split != "train" or (snapshot + k) % 3 != 2 for k in range(count)])
            images = np.stack([np.full((16, *GRID), snapshot + k, np.float32) for k in range(count)])
            boxes = np.full((count, 15, 5), -1, np.int32)
            boxes[labeled, 0] = [2, 6, 3, 9, 1]
            with h5py.File(root / split / f"year-{i}.h5", "w") as f:
                f["images"], f["boxes"], f["labeled"] = images, boxes, labeled.astype(np.int8)
            snapshot += count
    write_stats(root / "stats.h5", compute_stats(sorted(str(p) for p in (root / "train").glob("*.h5"))),
                EXTREMEWEATHER_CHANNELS)
    return root


def detection_cfg(root, **data) -> DetectConfig:
    return DetectConfig(task="detection", data={"data_dir": str(root), "grid": list(GRID), "batch_size": 2,
                                                "box_classes": "0-3", **data},
                        model={"filters": [4, 8], "head_level": 1}, train={"seed": 3})


def snapshot_of(images, root) -> np.ndarray:
    """The snapshot numbers of normalised ``images`` (each one value), from the training pixels' mean and std."""
    values = []
    for path in sorted((root / "train").glob("*.h5")):
        with h5py.File(path) as f:
            values.append(f["images"][:, 0, 0, 0])
    values = np.concatenate(values).astype(np.float64)
    return np.rint(np.asarray(images)[..., 0, 0, 0] * values.std() + values.mean()).astype(int)


def test_detection_evaluation_walk_is_every_labeled_snapshot_once_in_file_order(detection_files):
    samples_in_files = []
    for path in sorted((detection_files / "test").glob("*.h5")):
        with h5py.File(path) as f:
            samples_in_files += [(str(path), k, int(f["images"][k, 0, 0, 0])) for k in range(len(f["images"]))]
    dataset, samples = detection.evaluation_samples(detection_cfg(detection_files), "test")
    assert [(s.path, s.index) for s in samples] == [(path, k) for path, k, _ in samples_in_files]
    images, targets = zip(*[(x.numpy(), y["detect"].numpy()) for x, y in dataset])
    assert [len(x) for x in images] == [2, 2, 1]
    np.testing.assert_array_equal(snapshot_of(np.concatenate(images), detection_files),
                                  [value for _, _, value in samples_in_files])
    assert np.all(np.concatenate(targets)[..., TARGET_CHANNELS] == 1), "an evaluated snapshot flagged unlabeled"


@pytest.mark.parametrize("batch_size, labeled_per_batch, use_unlabeled", [(2, 1, True), (3, None, False)])
def test_detection_two_ranks_epochs_take_disjoint_labeled_samples_covering_the_split(
        detection_files, batch_size, labeled_per_batch, use_unlabeled):
    """Mixed batches (1 labeled + 1 unlabeled) and labeled ones only: each rank's epoch is 3 labeled samples."""
    root = detection_files
    cfg = detection_cfg(root, batch_size=batch_size, labeled_per_batch=labeled_per_batch,
                        use_unlabeled=use_unlabeled)
    n_labeled = labeled_per_batch or batch_size
    labeled, unlabeled = set(), set()
    for path in sorted((root / "train").glob("*.h5")):
        with h5py.File(path) as f:
            for value, flag in zip(f["images"][:, 0, 0, 0], f["labeled"][()]):
                (labeled if flag else unlabeled).add(int(value))
    assert len(labeled) == 6 and len(unlabeled) == 3
    for epoch in (0, 1):
        shares = []
        for rank in (0, 1):
            datasets = detection.build_datasets(cfg, rank_of(rank, 2))
            assert (datasets.steps_per_epoch, datasets.global_batch_size) == (3 // n_labeled, 2 * batch_size)
            share = []
            for images, targets in datasets.train_epoch(epoch):
                numbers, flags = snapshot_of(images, root), targets["detect"].numpy()[:, 0, 0, TARGET_CHANNELS]
                # Each batch: the labeled samples first, the unlabeled after (flagged 0, only for reconstruction).
                assert flags.tolist() == [1] * n_labeled + [0] * (batch_size - n_labeled)
                assert set(numbers[:n_labeled]) <= labeled and set(numbers[n_labeled:]) <= unlabeled
                share += numbers[:n_labeled].tolist()
            shares.append(share)
        assert [len(share) for share in shares] == [3, 3]
        assert not set(shares[0]) & set(shares[1]), "the ranks' labeled shares overlap"
        assert set(shares[0]) | set(shares[1]) == labeled, "an epoch of both ranks leaves labeled samples out"


def test_detection_counts_errors_name_the_key_and_the_folder(detection_files):
    root = detection_files
    with pytest.raises(DataError, match=rf"^{root}/train: 6 samples cannot fill one batch of 4 on each of 2 ranks "
                                        r"\(lower data\.labeled_per_batch"):
        detection.build_datasets(detection_cfg(root, labeled_per_batch=4, batch_size=5), rank_of(0, 2))
    with pytest.raises(DataError, match=rf"^{root}/validation: 6 samples cannot fill one batch of 4 on each of 2 "
                                        r"ranks \(lower data\.batch_size"):
        detection.build_datasets(detection_cfg(root, labeled_per_batch=1, batch_size=4), rank_of(0, 2))
