"""Several models in one job (``distributed.instances: K``): hyper-parameter sweeps and MLPerf HPC weak scaling.

The job's N ranks split into K instances of N/K contiguous ranks, each a Horovod process set
(:func:`common.distributed.init`).  Instance k trains its own model with the one trainer, unchanged: its
config is the job's with ``train.seed + k`` and its ``distributed.instance_overrides`` entry, its run folder
``<output-dir>/instance-<k>/`` holds everything a run writes (checkpoints, summary, MLPerf log), and every
collective of the trainer stays inside the instance.

How an instance ends, and what the job does:
- it finishes: its ranks wait for the others (a collective over the whole job);
- its loss, gradients or weights go non-finite (exit 3 for a lone run): that instance stops with the
  reason recorded and its last good checkpoint kept; the others train on;
- a preemption signal (SLURM signals every task): every instance checkpoints and stops;
- anything else (a crash, bad input): the job ends as a lone run would, with that rank's exit code.
Then ``<output-dir>/instances.json`` and a table on standard output: each instance's config differences,
outcome and final metrics, the time to the MLPerf target where MLPerf logging is on, and the MLPerf HPC
weak-scaling throughput (models trained to target per minute, from the earliest start to the latest end).
The job's exit code: 75 when an instance was preempted (``--resume`` continues every instance), else 3 when
one went non-finite, else 0.
"""

from __future__ import annotations

import logging
import pathlib

from common.config import instance_configs
from common.console import logs
from common.errors import EXIT_NONFINITE, EXIT_PREEMPTED, UserInputError
from common.storage import outputs, run_dirs
from common.storage.transaction import OutputTransaction, Producer

log = logging.getLogger(__name__)

INSTANCES_JSON = "instances.json"
# How a lone run's exit code reads as an instance's outcome; any other code ends the job as it would end a run.
OUTCOMES = {0: "finished", EXIT_NONFINITE: "non-finite", EXIT_PREEMPTED: "preempted"}


def instance_dir(output_dir, k: int) -> pathlib.Path:
    return pathlib.Path(output_dir) / f"instance-{k}"


class JobFolder:
    """The job's folder, claimed by world rank 0 before any instance checks its own: nothing but this suite's
    job of ``instances`` instances (:meth:`claim`: the checks, then the folder's lock, held for the job's
    life: a second job, or a lone run, on it is refused); marked as the job's only once every instance has
    passed its own checks (:meth:`commit`); a refused job leaves it as it was (:meth:`release`)."""

    def __init__(self, app, output_dir: pathlib.Path, instances: int, resume: bool, force: bool):
        self.app, self.output_dir, self.instances = app, outputs.normal_path(output_dir), instances
        self.resume, self.force = resume, force
        self.producer = Producer(command=f"{app.package}.train", application=app.package)
        self.transaction: OutputTransaction | None = None   # the claim: the one output transaction's, incremental
        self.committed = False

    def check(self) -> None:
        """The claim's checks that only read: every rank makes them before TensorFlow and Horovod load
        (``common.cli``); the claim makes them again, and its verdict is the one that counts."""
        outputs.check_writable_folder(self.output_dir, "--output-dir")
        run_dirs.check_run_dir(self.output_dir, self.resume, self.force)
        run_dirs.check_run_kind(self.output_dir, "instances", self.resume, self.instances)
        run_dirs.check_run_files(self.output_dir, [INSTANCES_JSON], self.force)

    def claim(self) -> str | None:
        """None, or the one-line reason the folder is refused (nothing written then)."""
        try:
            self.check()
            transaction = OutputTransaction(self.producer, self.force,
                                            holder=f"{self.app.name}.train (distributed.instances={self.instances})")
            transaction.into(self.output_dir, "instances", "--output-dir", incremental=True)
            transaction.check()
            transaction.claim()   # created, locked for the job's life, checked again under the lock
            self.transaction = transaction
        except UserInputError as exc:
            return str(exc)
        except OSError as exc:
            return f"{self.output_dir}: --output-dir cannot be prepared ({exc.strerror})"
        return None

    def commit(self) -> None:
        """Mark the folder as a job's, listing what the job writes (every instance has passed its checks)."""
        run_dirs.mark_run_dir(self.output_dir, self.app.name,
                             files=[INSTANCES_JSON, *[f"instance-{k}/" for k in range(self.instances)]],
                             kind="instances", instances=self.instances, producer=self.producer.record())
        self.committed = True

    def release(self) -> None:
        """Release the lock; a job refused before it committed leaves no trace of the claim."""
        transaction, self.transaction = self.transaction, None
        if transaction is None:
            return
        if self.committed:
            transaction.release()
        else:
            transaction.rollback()


def run_instances(app, cfg, dist, output_dir, train_one, resume: bool = False, force: bool = False) -> int:
    """Train this rank's instance with ``train_one(app, cfg, dist, run_dir, gate) -> (exit code, summary,
    reason)``, then gather every instance's outcome; returns the job's exit code.

    ``gate(refusal, final)`` is what the trainer calls on every rank after its instance's run folder is claimed
    and again once its checks are done (the data, the model, the checkpoint; ``final``), before it writes
    anything: every instance's verdict is gathered over the job, so one instance's bad override stops every
    instance before any of them writes."""
    output_dir = pathlib.Path(output_dir)
    configs = instance_configs(app.config_schema, cfg)   # every instance's config checked, on every rank
    k = dist.instance_index
    logs.configure(dist.rank, dist.size, ("common", app.package), instance=k)
    job_folder = JobFolder(app, output_dir, cfg.distributed.instances, resume, force)
    refused_together = False   # the gate refused on every rank: each undoes its instance's claim, then the job's
    try:
        refusal = job_folder.claim() if dist.world_rank == 0 else None
        refusal = dist.world_allgather_object(refusal)[0]
        if refusal is not None:
            raise UserInputError(refusal)

        def gate(refusal: str | None, final: bool) -> None:
            verdicts = dist.world_allgather_object((k, refusal))
            refused = [(index, reason) for index, reason in verdicts if reason is not None]
            if refused:
                nonlocal refused_together
                refused_together = True
                index, reason = refused[0]
                raise UserInputError(f"instance {index} of {cfg.distributed.instances}: {reason}; no instance started")
            if final and dist.world_rank == 0:
                job_folder.commit()

        code, summary, reason = train_one(app, configs[k], dist, instance_dir(output_dir, k), gate)
        if code not in OUTCOMES:
            return code
        records = dist.world_allgather_object({"instance": k, "rank": dist.rank, "exit_code": code, "reason": reason,
                                               "summary": summary if dist.rank == 0 else None})
        report = summarize(cfg, records, output_dir)
        if dist.world_rank == 0:
            outputs.write_json(output_dir / INSTANCES_JSON, report, f"{app.name}.train", force=force)
            print(table(report), flush=True)
        # No rank leaves before the report is written: a launcher ends the whole job at the first non-zero exit.
        dist.world_barrier()
        return job_exit_code([row["exit_code"] for row in report["instances"]])
    finally:
        if refused_together:
            # Every instance's run folder is undone (the trainer's close) before the job's folder is: rank 0
            # removes the job folder only when empty, and an instance's rank may be slower to leave than rank 0.
            dist.world_barrier()
        job_folder.release()


def summarize(cfg, records: list[dict], output_dir: pathlib.Path) -> dict:
    """instances.json from the gathered records (one per rank; an instance's outcome is its rank 0's)."""
    rows = []
    for k in range(cfg.distributed.instances):
        lead = next(r for r in records if r["instance"] == k and r["rank"] == 0)
        summary = lead["summary"] or {}
        overrides = {"train.seed": cfg.train.seed + k, **(cfg.distributed.instance_overrides[k]
                                                          if cfg.distributed.instance_overrides else {})}
        rows.append({
            "instance": k,
            "run_dir": str(instance_dir(output_dir, k)),
            "ranks": sum(1 for r in records if r["instance"] == k),
            "overrides": overrides,
            "outcome": OUTCOMES[lead["exit_code"]],
            "exit_code": lead["exit_code"],
            "reason": lead["reason"],
            "epochs_completed": summary.get("epochs_completed"),
            "final": summary.get("final", {}),
            "samples_per_second": summary.get("samples_per_second"),
            "wall_time_s": summary.get("wall_time_s"),
            "started_unix": summary.get("started_unix"),
            "mlperf_target_reached": summary.get("mlperf_target_reached"),
            "mlperf_time_to_target_s": summary.get("mlperf_time_to_target_s"),
        })
    return {"instances_count": len(rows), "ranks_per_instance": rows[0]["ranks"], "instances": rows,
            "weak_scaling": weak_scaling(rows, cfg.mlperf.enabled)}


def weak_scaling(rows: list[dict], mlperf: bool) -> dict:
    """MLPerf HPC's weak-scaling throughput: models trained to target per minute, over the span from the
    earliest instance start to the latest instance end.  Without MLPerf logging, finished models count."""
    done = [r for r in rows if r["outcome"] == "finished" and r["started_unix"] is not None
            and (r["mlperf_target_reached"] if mlperf else True)]
    timed = [r for r in rows if r["started_unix"] is not None and r["wall_time_s"] is not None]
    if not timed:
        return {"models": len(done), "span_s": None, "models_per_minute": None, "counted": "none finished"}
    span = max(r["started_unix"] + r["wall_time_s"] for r in timed) - min(r["started_unix"] for r in timed)
    return {"models": len(done), "span_s": span, "models_per_minute": len(done) / (span / 60.0) if span > 0 else None,
            "counted": "instances that reached the MLPerf target" if mlperf else "instances that finished"}


def table(report: dict) -> str:
    """The report as the lines the job prints at its end."""
    lines = [f"{report['instances_count']} instances x {report['ranks_per_instance']} rank(s):"]
    for row in report["instances"]:
        changed = ", ".join(f"{key}={value}" for key, value in row["overrides"].items())
        metrics = ", ".join(f"{key} {value:.4g}" for key, value in sorted(row["final"].items())
                            if key.startswith(("val_", "loss")))
        target = ""
        if row["mlperf_target_reached"] is not None:
            target = (f", MLPerf target in {row['mlperf_time_to_target_s']:.1f} s" if row["mlperf_target_reached"]
                      else ", MLPerf target not reached")
        why = f" ({row['reason']})" if row["reason"] else ""
        lines.append(f"  instance {row['instance']} [{changed}]: {row['outcome']}{why}"
                     + (f"; {metrics}" if metrics else "") + target)
    ws = report["weak_scaling"]
    if ws["models_per_minute"] is not None:
        lines.append(f"  weak scaling: {ws['models']} model(s) in {ws['span_s']:.1f} s = "
                     f"{ws['models_per_minute']:.3f} models/min ({ws['counted']})")
    return "\n".join(lines)


def job_exit_code(codes: list[int]) -> int:
    """75 when an instance was preempted (a requeue resumes them all), else 3 when one went non-finite, else 0."""
    if EXIT_PREEMPTED in codes:
        return EXIT_PREEMPTED
    if EXIT_NONFINITE in codes:
        return EXIT_NONFINITE
    return 0
