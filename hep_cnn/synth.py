"""Synthetic RPV-SUSY-like and QCD-like events as calorimeter images.

    python -m hep_cnn.synth --out DIR [--n-train N --n-validation N --n-test N] [--image-size 64]
    python -m hep_cnn.synth --config configs/hep_cnn/demo.yaml

Each event is a set of jets (pT in GeV, eta, phi, quark or gluon):

- signal (gluino pair, each decaying to three quarks, plus radiation):
  4 + Poisson(1.5) jets, pT ~ 40 + Gamma(2.5, 55) GeV, central (eta ~ N(0, 1)),
  quark jets (narrow, few tracks);
- QCD multijet background: 2 + Poisson(1.5) jets, leading-jet pT from a
  falling power law above 200 GeV, the others softer, wider in eta, mostly
  gluon jets (wider, more tracks).

Jets deposit E = pT cosh(eta) as 2D Gaussians on the (eta, phi) grid (phi
periodic), split into an electromagnetic part (EM fraction per jet) and
tracks (Poisson count around the jet axis); soft pile-up noise is added.
``passSR`` is the cut-based selection applied to the jets after a 10% pT
smearing: at least ``CUT_MIN_JETS`` jets above ``CUT_JET_PT`` GeV and a
scalar sum of jet pT (HT) above ``CUT_HT`` GeV.  Event weights are cross
section x luminosity / events generated, with a log-normal spread.

Output: HDF5 files in the ATLAS-style layout: group ``all_events`` with
``hist``, ``histEM``, ``histtrack`` (N, H, W) float32, ``y``, ``weight``,
``passSR``; files ``train_*.h5``, ``val_*.h5``, ``test_*.h5``.
"""

from __future__ import annotations

import argparse
import math
import pathlib

import h5py
import numpy as np

from common.cli import exit_process, non_negative_int_argument, positive_int_argument, run_command
from common.config import load_config
from common.console.progress import Progress
from common.storage.outputs import mark_hdf5
from common.storage.generated import generated_folder
from hep_cnn.config import HepConfig

CUT_JET_PT = 80.0
CUT_MIN_JETS = 5
CUT_HT = 1000.0
SIGNAL_WEIGHT = 0.05
BACKGROUND_WEIGHT = 5.0


def eta_range(image_size: int) -> float:
    """|eta| covered by the image: 2.5 for the 64x64 images, 5 for 224x224."""
    return 5.0 if image_size >= 128 else 2.5


def draw_jets(rng: np.random.Generator, signal: bool) -> np.ndarray:
    """Jets as rows (pT, eta, phi, is_quark)."""
    if signal:
        n = 4 + rng.poisson(1.5)
        pt = 40.0 + rng.gamma(2.5, 55.0, n)
        eta = rng.normal(0.0, 1.0, n)
        quark = rng.random(n) < 0.85
    else:
        n = 2 + rng.poisson(1.5)
        leading = 200.0 * (1.0 - rng.random()) ** (-1.0 / 3.0)   # p(pT) ~ pT^-4 above 200 GeV
        pt = np.concatenate([[leading], leading * rng.beta(2.0, 2.0, n - 1)])
        eta = rng.normal(0.0, 1.6, n)
        quark = rng.random(n) < 0.3
    phi = rng.uniform(-math.pi, math.pi, n)
    return np.stack([pt, eta, phi, quark.astype(float)], axis=1)


def passes_selection(jets: np.ndarray, rng: np.random.Generator) -> bool:
    """The cut-based signal region on smeared jet pT within the calorimeter acceptance."""
    pt = jets[:, 0] * rng.normal(1.0, 0.1, len(jets))
    accepted = np.abs(jets[:, 1]) < 2.5
    hard = pt[accepted & (pt > CUT_JET_PT)]
    return len(hard) >= CUT_MIN_JETS and hard.sum() > CUT_HT


def _profile(centres, width, edges, periodic_span=None):
    """Gaussian weight of each bin for each centre, (n_jets, n_bins), rows summing to ~1."""
    middle = 0.5 * (edges[:-1] + edges[1:])
    delta = middle[None, :] - centres[:, None]
    if periodic_span is not None:
        delta = (delta + periodic_span / 2) % periodic_span - periodic_span / 2
    profile = np.exp(-0.5 * (delta / width[:, None]) ** 2)
    return profile / np.maximum(profile.sum(axis=1, keepdims=True), 1e-12)


def render_event(jets: np.ndarray, image_size: int, rng: np.random.Generator) -> np.ndarray:
    """(3, H, W): calorimeter energy, EM energy, track count on the eta x phi grid."""
    eta_max = eta_range(image_size)
    eta_edges = np.linspace(-eta_max, eta_max, image_size + 1)
    phi_edges = np.linspace(-math.pi, math.pi, image_size + 1)
    inside = np.abs(jets[:, 1]) < eta_max
    jets = jets[inside]
    image = np.zeros((3, image_size, image_size), np.float32)
    if len(jets):
        pt, eta, phi, quark = jets.T
        energy = pt * np.cosh(eta)
        width = np.where(quark > 0, 0.06, 0.11) * (1.0 + 100.0 / pt)
        eta_profile = _profile(eta, width, eta_edges)
        phi_profile = _profile(phi, width, phi_edges, periodic_span=2 * math.pi)
        em_fraction = np.clip(rng.normal(np.where(quark > 0, 0.55, 0.4), 0.12), 0.05, 0.95)
        image[0] = np.einsum("j,je,jp->ep", energy, eta_profile, phi_profile)
        image[1] = np.einsum("j,je,jp->ep", energy * em_fraction, eta_profile, phi_profile)
        n_tracks = rng.poisson(np.where(quark > 0, 4.0, 8.0) + 2.0 * np.log1p(pt / 50.0))
        for j in range(len(jets)):
            t_eta = rng.normal(eta[j], width[j], n_tracks[j])
            t_phi = rng.normal(phi[j], width[j], n_tracks[j])
            h, _, _ = np.histogram2d(t_eta, (t_phi + math.pi) % (2 * math.pi) - math.pi,
                                     bins=(eta_edges, phi_edges))
            image[2] += h.astype(np.float32)
    # Soft pile-up: a few GeV scattered over random cells.
    cells = rng.integers(0, image_size, (rng.poisson(20), 2))
    deposits = rng.exponential(2.0, len(cells)).astype(np.float32)
    np.add.at(image[0], (cells[:, 0], cells[:, 1]), deposits)
    np.add.at(image[1], (cells[:, 0], cells[:, 1]), 0.5 * deposits)
    return image


def generate_events(n: int, image_size: int, signal_fraction: float, rng: np.random.Generator):
    """Arrays of one file: images (N, 3, H, W), y, weight, passSR."""
    images = np.empty((n, 3, image_size, image_size), np.float32)
    labels = (rng.random(n) < signal_fraction).astype(np.int32)
    weights = np.where(labels == 1, SIGNAL_WEIGHT, BACKGROUND_WEIGHT) * rng.lognormal(0.0, 0.3, n)
    pass_sr = np.zeros(n, np.int32)
    for i in range(n):
        jets = draw_jets(rng, bool(labels[i]))
        images[i] = render_event(jets, image_size, rng)
        pass_sr[i] = passes_selection(jets, rng)
    return images, labels, weights.astype(np.float32), pass_sr


def write_all_events(path, images, labels, weights, pass_sr) -> None:
    """The ATLAS-style layout (chunked, compressed: the images are mostly empty)."""
    chunk = (min(64, len(labels)),) + images.shape[2:]
    with h5py.File(path, "w") as f:
        mark_hdf5(f, "hep_cnn.synth")
        group = f.create_group("all_events")
        for name, channel in (("hist", 0), ("histEM", 1), ("histtrack", 2)):
            group.create_dataset(name, data=images[:, channel], chunks=chunk, compression="gzip",
                                 compression_opts=1, shuffle=True)
        group.create_dataset("y", data=labels)
        group.create_dataset("weight", data=weights)
        group.create_dataset("passSR", data=pass_sr)


def write_benchmark(path, images, labels, weights, pass_sr) -> None:
    """The SC17 benchmark layout: root datasets, images (N, 3, phi, eta) as the benchmark's files hold them."""
    images = np.ascontiguousarray(np.transpose(images, (0, 1, 3, 2)))
    with h5py.File(path, "w") as f:
        mark_hdf5(f, "hep_cnn.synth")
        f.create_dataset("data", data=images, chunks=(min(64, len(labels)),) + images.shape[1:], compression="gzip",
                         compression_opts=1, shuffle=True)
        f.create_dataset("label", data=labels)
        f.create_dataset("weight", data=weights)
        f.create_dataset("normweight", data=weights / weights.max())
        f.create_dataset("psr", data=pass_sr)


def generate_dataset(out_dir, n_train: int, n_validation: int, n_test: int, image_size: int = 64,
                     signal_fraction: float = 0.5, events_per_file: int = 1000, seed: int = 2017,
                     layout: str = "all_events", progress: bool = True) -> pathlib.Path:
    """Write train/val/test files into an absent or empty ``out_dir`` (or the empty folder it links to); it
    appears only when complete (:func:`common.storage.generated.generated_folder`)."""
    out_dir = pathlib.Path(out_dir)
    writer = write_all_events if layout == "all_events" else write_benchmark
    total = n_train + n_validation + n_test
    with generated_folder(out_dir, EXPECTED_LAYOUT) as work, \
            Progress(total, "synthetic events", "events", enabled=progress) as bar:
        for split_id, (split, count) in enumerate((("train", n_train), ("val", n_validation), ("test", n_test))):
            for index, start in enumerate(range(0, count, events_per_file)):
                n = min(events_per_file, count - start)
                rng = np.random.default_rng([seed, split_id, index])
                writer(work / f"{split}_{index:04d}.h5", *generate_events(n, image_size, signal_fraction, rng))
                bar.update(n)
    return out_dir


EXPECTED_LAYOUT = "HEP event files (*.h5 / *.hdf5)"


def dataset_present(directory) -> bool:
    """Whether ``directory`` already holds HDF5 files (then nothing is generated into it)."""
    directory = pathlib.Path(directory)
    return directory.is_dir() and any(p.suffix in (".h5", ".hdf5") for p in directory.iterdir())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hep_cnn.synth", description="Synthetic calorimeter events.")
    parser.add_argument("--config", help="take data_dir, image size, layout and counts from this config")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", help="output directory (default: the config's data.data_dir)")
    parser.add_argument("--n-train", type=positive_int_argument, help="default: data.synth.n_train")
    parser.add_argument("--n-validation", type=positive_int_argument, help="default: data.synth.n_validation")
    parser.add_argument("--n-test", type=positive_int_argument, help="default: data.synth.n_test")
    parser.add_argument("--image-size", type=positive_int_argument, help="eta x phi bins (default: data.image_size)")
    parser.add_argument("--layout", choices=["all_events", "benchmark"],
                        help="default: data.layout (all_events where it is auto)")
    parser.add_argument("--seed", type=non_negative_int_argument, help="default: data.synth.seed")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    cfg = load_config(HepConfig, args.config, args.set,
                      defaults={"data": {"data_dir": args.out or "data/hep-synthetic"}})
    out = pathlib.Path(args.out or cfg.data.data_dir)
    if dataset_present(out):
        print(f"events already present in {out}; to regenerate, remove it or choose another --out")
        return 0
    synth = cfg.data.synth
    generate_dataset(out, synth.n_train if args.n_train is None else args.n_train,
                     synth.n_validation if args.n_validation is None else args.n_validation,
                     synth.n_test if args.n_test is None else args.n_test,
                     cfg.data.image_size if args.image_size is None else args.image_size,
                     synth.signal_fraction, synth.events_per_file,
                     synth.seed if args.seed is None else args.seed,
                     args.layout or ("all_events" if cfg.data.layout == "auto" else cfg.data.layout))
    print(f"wrote synthetic events to {out}")
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name="hep_cnn.synth"))
