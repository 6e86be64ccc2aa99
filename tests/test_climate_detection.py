"""Semi-supervised detection: model shapes, box encoding, loss terms, AP/mAP, the ExtremeWeather reader, training."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from climate_seg.cam5.config import EXTREMEWEATHER_CHANNELS
from climate_seg.cam5.synth import detection_sample, grid_coordinates
from climate_seg.detection.boxes import average_precision, decode, encode, iou, nms
from climate_seg.detection.config import DetectConfig
from climate_seg.detection.data import read_sample, split_samples
from climate_seg.detection.loss import DetectionLoss, ReconstructionLoss
from climate_seg.detection.model import build_detector
from tests.conftest import run_python


def detect_cfg(**sections) -> DetectConfig:
    base = {"task": "detection", "data": {"data_dir": "unused", "grid": [32, 48], "batch_size": 2},
            "model": {"filters": [8, 16, 16], "time_steps": 4}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return DetectConfig(**base)


# -- model ------------------------------------------------------------------------------------

def shapes(model) -> dict:
    return {name: tuple(model.get_layer(name).output.shape) for name in ("detect", "recon")}


def test_detector_shapes_2d_3d_and_full_size():
    model = build_detector(detect_cfg())
    assert shapes(model) == {"detect": (None, 4, 6, 10), "recon": (None, 32, 48, 16)}
    model = build_detector(detect_cfg(model={"variant": "3d"}))
    assert model.input_shape == (None, 4, 32, 48, 16)
    assert shapes(model) == {"detect": (None, 4, 4, 6, 10), "recon": (None, 4, 32, 48, 16)}
    assert model.get_layer("encoder1").kernel.shape == (3, 5, 5, 16, 8)          # 3 x 5 x 5, stride 1 x 2 x 2
    assert model.get_layer("encoder1").strides == (1, 2, 2)
    # The published 2D network: 768 x 1152 -> 12 x 18 cells of 64 px, filters 128 ... 1280.
    full = build_detector(DetectConfig(task="detection", data={"data_dir": "unused"}))
    assert shapes(full)["detect"] == (None, 12, 18, 10)
    assert [full.get_layer(f"encoder{i}").filters for i in range(1, 7)] == [128, 256, 512, 768, 1024, 1280]


@pytest.mark.parametrize("variant", ["2d", "3d"])
def test_a_finer_head_reads_its_level_and_the_bottleneck(variant):
    cfg = detect_cfg(model={"variant": variant, "head_level": 2})
    assert cfg.model.cell == 4
    model = build_detector(cfg)
    steps = (4,) if variant == "3d" else ()
    assert shapes(model)["detect"] == (None, *steps, 8, 12, 10)
    # The head sees level 2 (16 filters) and the 2x upsampled bottleneck (16 filters).
    assert tuple(model.get_layer("head_features").output.shape) == (None, *steps, 8, 12, 32)
    assert build_detector(detect_cfg(model={"head_level": 3})).get_layer("detect").output.shape[1:3] == (4, 6)
    with pytest.raises(ValueError, match="head_level 4 is deeper than the 3 encoder levels"):
        detect_cfg(model={"head_level": 4})


# -- boxes ------------------------------------------------------------------------------------

def test_box_encoding_round_trip():
    rng = np.random.default_rng(0)
    cell, grid = 16, (6, 8)
    boxes = []
    for i, j in [(0, 0), (2, 5), (5, 7), (3, 1)]:
        cy, cx = (i + rng.random()) * cell, (j + rng.random()) * cell
        h, w = rng.uniform(3, 60, 2)                        # smaller and larger than a cell
        boxes.append([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2, rng.integers(0, 4)])
    target = encode(np.array(boxes + [[-1, -1, -1, -1, -1]]), grid, cell)
    assert target[..., 0].sum() == 4
    decoded = decode(target[..., 2:4], target[..., 4:6], cell)
    for box in boxes:
        i, j = int((box[0] + box[2]) / 2 // cell), int((box[1] + box[3]) / 2 // cell)
        np.testing.assert_allclose(decoded[i, j], box[:4], atol=1e-3)
        assert target[i, j, 1] == box[4]
    # Two centres in one cell: the larger box is kept.
    two = encode(np.array([[0, 0, 4, 4, 1], [0, 0, 8, 8, 2]], float), grid, cell)
    assert two[0, 0, 1] == 2 and two[..., 0].sum() == 1


def test_iou_and_nms():
    a = np.array([[0, 0, 10, 10], [0, 5, 10, 15], [20, 20, 30, 30]], float)
    np.testing.assert_allclose(iou(a, a)[0], [1.0, 50 / 150, 0.0])
    assert nms(a, np.array([0.9, 0.8, 0.7]), 0.3).tolist() == [0, 2]
    assert nms(a, np.array([0.9, 0.8, 0.7]), 0.5).tolist() == [0, 1, 2]
    assert nms(np.zeros((0, 4)), np.zeros(0), 0.5).tolist() == []


def greedy_nms(boxes, scores, iou_threshold):
    """The textbook loop: keep the best, drop what overlaps it by more than the threshold, repeat."""
    order, keep = list(np.argsort(-scores)), []
    while order:
        best, order = order[0], order[1:]
        keep.append(best)
        order = [k for k in order if iou(boxes[best], boxes[k])[0, 0] <= iou_threshold]
    return keep


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nms_equals_the_greedy_loop(seed):
    rng = np.random.default_rng(seed)
    corners = rng.uniform(0, 64, (200, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(4, 24, (200, 2))], axis=1)
    scores = rng.permutation(200) / 200.0   # distinct scores: one order for both
    for threshold in (0.1, 0.3, 0.5):
        assert nms(boxes, scores, threshold).tolist() == greedy_nms(boxes, scores, threshold)


# -- loss -------------------------------------------------------------------------------------

def logits_for(p):
    return np.log(p)


def test_each_loss_term_on_hand_built_targets():
    # One labeled sample, a 1 x 2 grid: cell 0 holds a class-2 box, cell 1 is empty.
    y_true = np.zeros((1, 1, 2, 7), np.float32)
    y_true[0, 0, 0] = [1, 2, 0.3, 0.6, 0.5, -1.0, 1]
    y_true[0, 0, 1, 6] = 1
    y_pred = np.zeros((1, 1, 2, 10), np.float32)
    y_pred[0, 0, 0, 0:2] = logits_for([0.2, 0.8])                        # p(object) = 0.8
    y_pred[0, 0, 0, 2:6] = logits_for([0.1, 0.2, 0.6, 0.1])              # p(class 2) = 0.6
    y_pred[0, 0, 0, 6:10] = [0.5, 0.6, 2.5, -1.0]                        # x off by 0.2; w off by 2 (linear part)
    y_pred[0, 0, 1, 0:2] = logits_for([0.9, 0.1])                        # p(no object) = 0.9
    xy = 5 * (0.5 * 0.2 ** 2)
    wh = 7 * (2.0 - 0.5)
    expected = xy + wh - np.log(0.8) - np.log(0.6) - 0.5 * np.log(0.9)
    assert float(DetectionLoss()(y_true, y_pred)) == pytest.approx(expected, rel=1e-5)
    # Term by term, through the coefficients.
    assert float(DetectionLoss(coord_xy=0, coord_wh=0, no_object=0)(y_true, y_pred)) == \
        pytest.approx(-np.log(0.8) - np.log(0.6), rel=1e-5)
    assert float(DetectionLoss(coord_xy=1, coord_wh=0, no_object=1)(y_true, y_pred)) == \
        pytest.approx(0.02 - np.log(0.8) - np.log(0.6) - np.log(0.9), rel=1e-5)
    # An unlabeled sample adds nothing, whatever it predicts; the mean runs over labeled samples.
    unlabeled = y_true.copy()
    unlabeled[..., 6] = 0
    assert float(DetectionLoss()(unlabeled, y_pred)) == 0.0
    both_true, both_pred = np.concatenate([y_true, unlabeled]), np.concatenate([y_pred, y_pred * 3])
    assert float(DetectionLoss()(both_true, both_pred)) == pytest.approx(expected, rel=1e-5)
    # Reconstruction: lambda x MSE on every sample.
    x = np.random.default_rng(1).normal(size=(2, 4, 4, 3)).astype(np.float32)
    assert float(ReconstructionLoss(10.0)(x, x + 0.5)) == pytest.approx(10 * 0.25, rel=1e-6)
    assert float(ReconstructionLoss(0.0)(x, x + 0.5)) == 0.0


# -- average precision ------------------------------------------------------------------------------

def test_average_precision_hand_built():
    truth = [np.array([[0, 0, 10, 10, 0], [50, 50, 60, 60, 0]], float)]
    hit = (np.array([0, 0, 10, 10.0]), 0.9, 0)
    false_positive = (np.array([30, 30, 40, 40.0]), 0.8, 0)
    # P/R: (1, 0.5) then (0.5, 0.5); the second true box is never found: AP = 0.5, not 1.
    assert average_precision([[hit, false_positive]], truth, 0, 0.5) == pytest.approx(0.5)
    # Finding it later at lower score: recall 1 at precision 2/3.
    late = (np.array([50, 50, 60, 61.0]), 0.7, 0)
    assert average_precision([[hit, false_positive, late]], truth, 0, 0.5) == pytest.approx(0.5 + 0.5 * 2 / 3)
    # IoU 0.1 accepts a loose box that IoU 0.5 rejects; a class with no truth has no AP.
    loose = (np.array([0, 0, 20, 20.0]), 0.9, 0)
    assert average_precision([[loose]], truth, 0, 0.1) == pytest.approx(0.5)
    assert average_precision([[loose]], truth, 0, 0.5) == 0.0
    assert average_precision([[loose]], truth, 3, 0.5) is None


def brute_force_ap(predictions, truths, cls, threshold):
    """Independent AP: precision and recall recomputed from scratch at every score cut, then the
    VOC all-point area (max precision at recall >= r, integrated over recall)."""
    scores = sorted({s for preds in predictions for _, s, c in preds if c == cls}, reverse=True)
    total = sum(int((np.asarray(t).reshape(-1, 5)[:, 4] == cls).sum()) for t in truths)
    points = [(0.0, 1.0)]
    for cut in scores:
        tp = fp = 0
        for preds, truth in zip(predictions, truths):
            gts = [g[:4] for g in np.asarray(truth).reshape(-1, 5) if g[4] == cls]
            used = [False] * len(gts)
            for box, s, c in sorted(preds, key=lambda p: -p[1]):
                if c != cls or s < cut:
                    continue
                best, best_iou = None, -1.0
                for k, g in enumerate(gts):
                    value = iou(np.asarray(box)[None], np.asarray(g)[None])[0, 0]
                    if not used[k] and value > best_iou:
                        best, best_iou = k, value
                if best is not None and best_iou >= threshold:
                    used[best], tp = True, tp + 1
                else:
                    fp += 1
        points.append((tp / total, tp / (tp + fp)))
    recalls = sorted({r for r, _ in points})
    area, previous = 0.0, 0.0
    for r in recalls:
        if r == 0:
            continue
        area += (r - previous) * max(p for rr, p in points if rr >= r)
        previous = r
    return area


def test_average_precision_against_an_independent_computation():
    rng = np.random.default_rng(3)
    predictions, truths = [], []
    for _ in range(6):
        centres = rng.uniform(0, 100, (4, 2))
        truth = np.array([[y - 5, x - 5, y + 5, x + 5, rng.integers(0, 2)] for y, x in centres])
        preds = []
        for y, x in centres[:3] + rng.normal(0, 3, (3, 2)):
            preds.append((np.array([y - 5, x - 5, y + 5, x + 5]), float(rng.random()), int(rng.integers(0, 2))))
        for y, x in rng.uniform(0, 100, (2, 2)):
            preds.append((np.array([y - 5, x - 5, y + 5, x + 5]), float(rng.random()), int(rng.integers(0, 2))))
        predictions.append(preds)
        truths.append(truth)
    for cls in (0, 1):
        for threshold in (0.1, 0.5):
            assert average_precision(predictions, truths, cls, threshold) == \
                pytest.approx(brute_force_ap(predictions, truths, cls, threshold), abs=1e-9)


# -- data ------------------------------------------------------------------------------------------------

def test_reader_selects_channels_and_box_columns_by_name(tmp_path):
    rng = np.random.default_rng(5)
    file_channels = list(reversed(EXTREMEWEATHER_CHANNELS))               # not the default order
    images = rng.normal(size=(3, 16, 32, 48)).astype(np.float32)
    boxes = np.full((3, 15, 5), -1.0, np.float32)
    # Columns stored as [class, xmin, ymin, xmax, ymax].
    boxes[0, 0] = [3, 10, 4, 30, 12]
    (tmp_path / "train").mkdir()
    with h5py.File(tmp_path / "train" / "year.h5", "w") as f:
        f["images"], f["boxes"], f["labeled"] = images, boxes, np.array([1, 0, 1], np.int8)
    cfg = detect_cfg(data={"data_dir": str(tmp_path), "file_channels": file_channels,
                           "channels": ["TMQ", "PSL", "U850"],
                           "box_columns": ["class", "xmin", "ymin", "xmax", "ymax"], "box_classes": "0-3"})
    x, target = read_sample(cfg, str(tmp_path / "train" / "year.h5"), 0, True, np.zeros(3, np.float32),
                            np.ones(3, np.float32))
    for k, name in enumerate(["TMQ", "PSL", "U850"]):
        np.testing.assert_array_equal(x[..., k], images[0, file_channels.index(name)])
    # Box ymin 4, xmin 10, ymax 12, xmax 30: centre (8, 20) -> cell (1, 2) of 8 px, class 3.
    assert target[1, 2, 0] == 1 and target[1, 2, 1] == 3 and target[..., 0].sum() == 1
    assert target[..., 6].min() == 1
    samples = split_samples(cfg, "train")
    assert [s.labeled for s in samples] == [True, False, True]
    hidden = split_samples(detect_cfg(data={"data_dir": str(tmp_path), "file_channels": file_channels,
                                            "unlabeled_samples": [2], "box_classes": "0-3",
                                            "box_columns": ["class", "xmin", "ymin", "xmax", "ymax"]}), "train")
    assert [s.labeled for s in hidden] == [True, False, False]


def test_synthetic_boxes_sit_on_the_features(tmp_path):
    lat, lon = grid_coordinates(128, 192)
    rng = np.random.default_rng(11)
    found = {c: 0 for c in range(4)}
    for _ in range(12):
        fields, boxes = detection_sample(rng, lat, lon)
        psl, tmq = fields["PSL"], fields["TMQ"]
        wind = np.hypot(fields["UBOT"], fields["VBOT"])
        for ymin, xmin, ymax, xmax, cls in boxes[boxes[:, 4] >= 0]:
            inside = (slice(int(ymin), int(ymax)), slice(int(xmin), int(xmax)))
            found[int(cls)] += 1
            h, w = int(ymax - ymin), int(xmax - xmin)
            around = (slice(max(0, int(ymin) - h), int(ymax) + h), slice(max(0, int(xmin) - w), int(xmax) + w))
            if cls in (0, 1, 2):     # lows: a pressure minimum below the box's surroundings, and a vortex
                assert psl[inside].min() < psl[around].mean() - 300, (cls, psl[inside].min(), psl[around].mean())
                assert wind[inside].max() > 8.0
            else:                    # rivers: moisture well above the surroundings
                assert tmq[inside].max() > tmq[around].mean() + 8
    assert all(found.values()), found


@pytest.mark.horovod
def test_tiny_two_rank_detection_train_and_evaluate(tmp_path):
    run = tmp_path / "run"
    overrides = {"data.data_dir": str(tmp_path / "data"), "data.grid": "[64, 96]", "data.synth.grid": "[64, 96]",
                 "data.synth.n_train": "24", "data.synth.n_validation": "8", "data.synth.n_test": "8",
                 "data.synth.samples_per_file": "8", "data.batch_size": "4", "data.labeled_fraction": "1.0",
                 "model.filters": "[8, 16, 16]", "train.epochs": "2", "train.tensorboard": "false"}
    args = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_detect.yaml", "--output-dir",
                str(run), *args], ranks=2)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["epochs_completed"] == 2
    assert {"detect_loss", "recon_loss", "val_detect_loss"} <= set(summary["final"])
    result = run_python(["-m", "climate_seg.evaluate", "--run-dir", str(run)])
    metrics = json.loads((run / "metrics.json").read_text())
    assert set(metrics["map"]) == {"iou_0.1", "iou_0.5"}
    for key in ("iou_0.1", "iou_0.5"):
        assert set(metrics["ap"][key]) | set(metrics["absent_classes"]) == {
            "tropical_depression", "tropical_cyclone", "extratropical_cyclone", "atmospheric_river"}
        assert all(0.0 <= v <= 1.0 for v in metrics["ap"][key].values())
    assert (run / "boxes.png").stat().st_size > 10_000 and (run / "reconstruction.png").stat().st_size > 10_000
    assert "mAP@0.1" in result.stdout


def test_tiny_3d_variant_trains_on_windows_and_evaluates(tmp_path):
    run = tmp_path / "run"
    overrides = {"data.data_dir": str(tmp_path / "data"), "data.grid": "[32, 48]", "data.synth.grid": "[32, 48]",
                 "data.synth.n_train": "16", "data.synth.n_validation": "8", "data.synth.n_test": "8",
                 "data.synth.samples_per_file": "8", "data.synth.unlabeled_every": "0", "data.batch_size": "2",
                 "data.labeled_per_batch": "1", "data.labeled_fraction": "0.5", "model.variant": "3d",
                 "model.time_steps": "2", "model.filters": "[4, 8]", "train.epochs": "1",
                 "train.tensorboard": "false"}
    args = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    result = run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_detect.yaml", "--output-dir",
                         str(run), *args])
    # 16 snapshots -> 8 windows of 2; half the labeled windows hidden: 4 labeled + 4 unlabeled.
    assert "4 labeled and 4 unlabeled training samples" in result.stdout
    run_python(["-m", "climate_seg.evaluate", "--run-dir", str(run)])
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["n_images"] == 8            # 4 test windows x 2 time steps, each with its own boxes


def test_stats_tool_reads_extremeweather_files(tmp_path):
    rng = np.random.default_rng(9)
    images = [rng.normal(loc=np.arange(16)[None, :, None, None], size=(n, 16, 8, 12)).astype(np.float32)
              for n in (20, 7)]
    (tmp_path / "train").mkdir()
    for k, block in enumerate(images):
        with h5py.File(tmp_path / "train" / f"year{k}.h5", "w") as f:
            f["images"], f["boxes"] = block, np.full((len(block), 15, 5), -1.0, np.float32)
    run_python(["-m", "climate_seg.cam5.stats", str(tmp_path / "train")])
    pixels = np.concatenate([np.transpose(b, (0, 2, 3, 1)).reshape(-1, 16) for b in images]).astype(np.float64)
    with h5py.File(tmp_path / "stats.h5") as f:
        np.testing.assert_allclose(f["mean"][()], pixels.mean(axis=0), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(f["std"][()], pixels.std(axis=0), rtol=1e-9)
        np.testing.assert_array_equal(f["max"][()], pixels.max(axis=0))
        assert f.attrs["channels"].split(",") == list(EXTREMEWEATHER_CHANNELS)
