"""How separable are the synthetic HEP events?  A classifier on the generator's own jets, not on images.

    python scripts/hep_truth_ceiling.py [--events 120000] [--image-size 64]

Draws events from ``hep_cnn.synth.draw_jets`` (half signal, half background),
keeps the jets inside the image's eta acceptance, and trains scikit-learn's
HistGradientBoostingClassifier on the leading eight jets' pT and eta, their
quark/gluon flags (optional), the number of jets and HT; prints the test
ROC AUC.  The images are drawn from these jets plus noise that does not
depend on the label, so a network on images cannot do better than the best
classifier on the jets with their flags: that run is the ceiling (loose where
the booster is not the best classifier), not a target.  Without the flags the
figure is no ceiling: the images show each jet's quark/gluon character through
its width, EM fraction and track count (the HEP demo's CNN passes it with
16,000 training events: README).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import roc_auc_score

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from common.cli import exit_process, non_negative_int_argument, positive_int_argument, run_command  # noqa: E402
from hep_cnn.synth import draw_jets, eta_range  # noqa: E402

LEADING = 8


def jet_features(jets: np.ndarray, eta_max: float, quark_flags: bool) -> np.ndarray:
    visible = jets[np.abs(jets[:, 1]) < eta_max]
    visible = visible[np.argsort(-visible[:, 0])]
    features = np.zeros(3 * LEADING + 2)
    n = min(LEADING, len(visible))
    features[:n] = visible[:n, 0]
    features[LEADING:LEADING + n] = visible[:n, 1]
    if quark_flags:
        features[2 * LEADING:2 * LEADING + n] = visible[:n, 3]
    features[-2:] = len(visible), visible[:, 0].sum()
    return features


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=positive_int_argument, default=120_000)
    parser.add_argument("--image-size", type=positive_int_argument, default=64)
    parser.add_argument("--seed", type=non_negative_int_argument, default=0)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rng = np.random.default_rng(args.seed)
    labels = (rng.random(args.events) < 0.5).astype(int)
    events = [draw_jets(rng, bool(y)) for y in labels]
    train = args.events * 3 // 4
    for quark_flags in (False, True):
        x = np.array([jet_features(j, eta_range(args.image_size), quark_flags) for j in events])
        booster = HistGradientBoostingClassifier(max_iter=300, random_state=args.seed).fit(x[:train], labels[:train])
        auc = roc_auc_score(labels[train:], booster.predict_proba(x[train:])[:, 1])
        what = "pT, eta, count, HT + quark/gluon flags" if quark_flags else "pT, eta, count, HT"
        print(f"jets inside |eta| < {eta_range(args.image_size):g}, {what}: test AUC {auc:.4f}")
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name="scripts.hep_truth_ceiling"))
