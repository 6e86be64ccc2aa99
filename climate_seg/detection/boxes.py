"""Boxes for extreme-weather detection: the one-box-per-cell encoding, IoU, NMS (TensorFlow's) and average precision.

Boxes are (ymin, xmin, ymax, xmax) in pixels of the network input, with a
class index 0-3 (:data:`DETECTION_CLASSES`).  A grid of cells of ``cell``
pixels holds at most one box per cell, the one whose centre falls in it (the
largest when several do), encoded as (x, y) = the centre's offset inside the
cell in [0, 1) and (w, h) = log2(size / cell), so boxes smaller than a cell
are representable.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

DETECTION_CLASSES = ("tropical_depression", "tropical_cyclone", "extratropical_cyclone", "atmospheric_river")
# Per-cell target layout: objectness, class, x, y, log2 w, log2 h.
TARGET_CHANNELS = 6


def encode(boxes: np.ndarray, grid: tuple[int, int], cell: int) -> np.ndarray:
    """(gy, gx, 6) targets [object, class, x, y, log2 w/cell, log2 h/cell] from (n, 5) boxes
    [ymin, xmin, ymax, xmax, class]; rows with class < 0 (padding) are ignored."""
    target = np.zeros((*grid, TARGET_CHANNELS), np.float32)
    area = np.zeros(grid, np.float32)
    for ymin, xmin, ymax, xmax, cls in np.asarray(boxes, np.float64).reshape(-1, 5):
        if cls < 0:
            continue
        h, w = max(ymax - ymin, 1e-3), max(xmax - xmin, 1e-3)
        cy, cx = (ymin + ymax) / 2, (xmin + xmax) / 2
        i = int(np.clip(np.floor(cy / cell), 0, grid[0] - 1))
        j = int(np.clip(np.floor(cx / cell), 0, grid[1] - 1))
        if h * w <= area[i, j]:
            continue
        area[i, j] = h * w
        target[i, j] = (1.0, cls, cx / cell - j, cy / cell - i, np.log2(w / cell), np.log2(h / cell))
    return target


def decode(xy: np.ndarray, log_wh: np.ndarray, cell: int) -> np.ndarray:
    """(gy, gx, 4) boxes [ymin, xmin, ymax, xmax] from per-cell (x, y) offsets and log2 (w, h)."""
    gy, gx = xy.shape[:2]
    cx = (np.arange(gx)[None, :] + xy[..., 0]) * cell
    cy = (np.arange(gy)[:, None] + xy[..., 1]) * cell
    w, h = cell * 2.0 ** log_wh[..., 0], cell * 2.0 ** log_wh[..., 1]
    return np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=-1)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of (n, 4) and (m, 4) boxes [ymin, xmin, ymax, xmax] -> (n, m)."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    top = np.maximum(a[:, None, 0], b[None, :, 0])
    left = np.maximum(a[:, None, 1], b[None, :, 1])
    bottom = np.minimum(a[:, None, 2], b[None, :, 2])
    right = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(bottom - top, 0, None) * np.clip(right - left, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression (TensorFlow's), highest score first; a box is
    suppressed when its IoU with a kept one exceeds ``iou_threshold``."""
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    keep = tf.image.non_max_suppression(boxes, np.asarray(scores, np.float32), max_output_size=len(boxes),
                                        iou_threshold=iou_threshold)
    return keep.numpy().astype(np.int64)


def detections(objectness: np.ndarray, class_probs: np.ndarray, xy: np.ndarray, log_wh: np.ndarray, cell: int,
               score_threshold: float, nms_iou: float) -> list[tuple[np.ndarray, float, int]]:
    """One image's detections [(box, score, class)]: score = p(object) x p(class), thresholded,
    then NMS per class."""
    boxes = decode(xy, log_wh, cell).reshape(-1, 4)
    classes = class_probs.reshape(-1, class_probs.shape[-1]).argmax(axis=-1)
    scores = objectness.reshape(-1) * class_probs.reshape(-1, class_probs.shape[-1]).max(axis=-1)
    out = []
    for cls in np.unique(classes):
        idx = np.nonzero((classes == cls) & (scores >= score_threshold))[0]
        for k in idx[nms(boxes[idx], scores[idx], nms_iou)] if idx.size else []:
            out.append((boxes[k], float(scores[k]), int(cls)))
    return out


def average_precision(predictions: list[list[tuple]], truths: list[np.ndarray], cls: int,
                      iou_threshold: float) -> float | None:
    """AP of one class over a set of images (all-point interpolated precision-recall area).

    ``predictions[i]``: image i's [(box, score, class)]; ``truths[i]``: its
    (n, 5) boxes [ymin, xmin, ymax, xmax, class] (class < 0: padding).  A
    prediction is a true positive when it overlaps an unmatched true box of
    its class by at least ``iou_threshold`` (highest scores matched first).
    Every true box that no prediction matches is a miss: recall is divided by
    all of them.  None when the class has no true box.
    """
    truth_boxes = [np.asarray(t, np.float64).reshape(-1, 5) for t in truths]
    truth_boxes = [t[t[:, 4] == cls, :4] for t in truth_boxes]
    total = sum(len(t) for t in truth_boxes)
    if total == 0:
        return None
    found = [(score, image, box) for image, preds in enumerate(predictions) for box, score, c in preds if c == cls]
    found.sort(key=lambda item: -item[0])
    matched = [np.zeros(len(t), bool) for t in truth_boxes]
    hits = np.zeros(len(found))
    for k, (_, image, box) in enumerate(found):
        candidates = truth_boxes[image]
        if not len(candidates):
            continue
        overlaps = iou(box[None], candidates)[0]
        overlaps[matched[image]] = -1.0
        best = int(np.argmax(overlaps))
        if overlaps[best] >= iou_threshold:
            matched[image][best] = True
            hits[k] = 1.0
    true_positives = np.cumsum(hits)
    recall = true_positives / total
    precision = true_positives / np.arange(1, len(found) + 1)
    # All-point interpolation: precision made monotone from the right, integrated over recall steps.
    recall = np.concatenate([[0.0], recall, [1.0]])
    precision = np.concatenate([[0.0], precision, [0.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.nonzero(recall[1:] != recall[:-1])[0]
    return float(np.sum((recall[steps + 1] - recall[steps]) * precision[steps + 1]))
