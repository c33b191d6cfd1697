"""The training loop every lecture uses: seeded, device-aware, with per-step times and curves.

One step is split in two on purpose: :func:`compute_gradients` (forward + backward) and the
optimiser's ``step()``. A data-parallel loop inserts gradient communication between them
(source 000, steps 4-6: compute gradients, send them to the server, apply the combined ones);
:func:`fit` takes that as ``grad_hook``.

Kept whole: one loop, ``fit``, and the settings, history and step functions it is made of.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from course_lib import checkpoint as ckpt_lib
from course_lib.training.batch_schedules import BatchRampUp
from course_lib.training.layerwise import LAMB, LARS
from course_lib.training.lr_schedules import LinearScalingWarmup, StepDecay

__all__ = [
    "OPTIMIZERS",
    "TrainConfig",
    "History",
    "seed_everything",
    "default_device",
    "compute_gradients",
    "train_step",
    "evaluate",
    "segmentation_scores",
    "make_optimizer",
    "fit",
]


#: The optimisers ``TrainConfig.optimizer`` can name (:func:`make_optimizer` builds them).
OPTIMIZERS = ("sgd", "adam", "lars", "lamb")


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run; invalid values raise ValueError on creation."""

    num_epochs: int = 10
    lr: float = 0.1
    batch_size: int = 32
    momentum: float = 0.0
    #: "sgd" (with ``momentum``) or "adam"; Adam trains the U-Net (no batch norm) far faster.
    #: Lecture 12's layer-wise ones: "lars" (with ``momentum``; ``lr`` is the global rate, the
    #: paper's trust coefficient 0.001 scales it down: try lr 1 to 20) or "lamb" (lr ~ 1e-3 to 1e-2).
    optimizer: str = "sgd"
    seed: int = 0
    #: Stop early once ``target_metric`` (e.g. "test_accuracy") reaches ``target`` (source 000's
    #: stop criterion "target accuracy reached").
    target: float | None = None
    target_metric: str = "test_accuracy"
    #: A learning-rate schedule (lecture 12), ``LinearScalingWarmup`` or ``StepDecay``: ``fit``
    #: sets the optimiser's lr to ``lr_schedule.lr_at(step, base_lr=lr, ...)`` before every step.
    lr_schedule: LinearScalingWarmup | StepDecay | None = None
    #: A batch schedule (lecture 12), e.g. ``BatchRampUp``: epoch ``e`` trains with batches of
    #: ``batch_size * batch_schedule.factor_at(e)``.
    batch_schedule: BatchRampUp | None = None

    def __post_init__(self) -> None:
        if self.num_epochs < 1:
            raise ValueError(f"num_epochs must be at least 1, got {self.num_epochs}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive (try 0.01 to 0.5), got {self.lr}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {', '.join(map(repr, OPTIMIZERS))}, got {self.optimizer!r}"
            )
        if self.lr_schedule is not None:
            self.lr_schedule.check(self.num_epochs)
        if self.batch_schedule is not None:
            self.batch_schedule.check(self.num_epochs)
            if self.lr_schedule is not None:  # its steps per epoch would change under it
                raise ValueError(
                    "use lr_schedule or batch_schedule, not both (Smith et al. "
                    "2018 grow the batch in place of changing the lr)"
                )


@dataclass
class History:
    """Per-epoch metrics and per-step wall times of one run; ``plot()`` draws learning curves."""

    epochs: list[dict[str, float]] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)

    def metric(self, name: str) -> list[float]:
        """Return the values of metric ``name`` (e.g. ``"train_loss"``), one per epoch."""
        return [e[name] for e in self.epochs if name in e]

    def epochs_to_reach(self, name: str, target: float) -> int | None:
        """Return the first epoch (counting from 1) where ``name`` >= ``target``, else None."""
        for e in self.epochs:
            if e.get(name, -np.inf) >= target:
                return int(e["epoch"])
        return None

    @property
    def last(self) -> dict[str, float]:
        """Return the metrics of the last epoch."""
        return self.epochs[-1] if self.epochs else {}

    def plot(self, title: str = "") -> Figure:
        """Return a figure: losses on the left, accuracy (and mIoU) on the right, per epoch."""
        fig = Figure(figsize=(8, 3), dpi=100)
        ax_loss, ax_acc = fig.subplots(1, 2)
        for ax, names in ((ax_loss, ("loss",)), (ax_acc, ("accuracy", "miou"))):
            for split in ("train", "test"):
                for name in names:
                    values = self.metric(f"{split}_{name}")
                    if values:
                        ax.plot(
                            range(1, len(values) + 1), values, marker=".", label=f"{split} {name}"
                        )
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
            ax.legend()
        ax_loss.set_ylabel("loss")
        ax_acc.set_ylabel("accuracy / mIoU" if self.metric("train_miou") else "accuracy")
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        return fig


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so that a run can be repeated exactly (on one device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def default_device() -> torch.device:
    """Return the GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compute_gradients(
    net: nn.Module, X: torch.Tensor, y: torch.Tensor, loss_fn: Callable
) -> tuple[float, torch.Tensor]:
    """Zero ``net``'s gradients and fill them for the batch (X, y); return (loss, outputs)."""
    net.zero_grad(set_to_none=True)
    outputs = net(X)
    loss = loss_fn(outputs, y)
    loss.backward()
    return loss.item(), outputs.detach()


def train_step(
    net: nn.Module, X: torch.Tensor, y: torch.Tensor, loss_fn: Callable, optimizer
) -> float:
    """Do one optimisation step on the batch (X, y) in place; return the batch's loss."""
    loss, _ = compute_gradients(net, X, y, loss_fn)
    optimizer.step()
    return loss


def segmentation_scores(confusion: torch.Tensor) -> dict[str, float]:
    """Return pixel accuracy and mIoU from a (classes x classes) confusion matrix.

    IoU_c = TP_c / (TP_c + FP_c + FN_c); the mean skips classes absent from both the truth and
    the prediction (their IoU is 0/0).
    """
    confusion = confusion.double()
    tp = confusion.diag()
    union = confusion.sum(0) + confusion.sum(1) - tp
    present = union > 0
    return {
        "accuracy": (tp.sum() / confusion.sum()).item(),
        "miou": (tp[present] / union[present]).mean().item(),
    }


@torch.no_grad()
def evaluate(
    net: nn.Module,
    data: DataLoader,
    loss_fn: Callable,
    *,
    device: torch.device | None = None,
    num_classes: int | None = None,
) -> dict[str, float]:
    """Return mean loss and accuracy of ``net`` on ``data`` (and mIoU for segmentation).

    A target with more than one dimension per sample (N, H, W) means segmentation: accuracy is
    then pixel accuracy; pixels labelled 255 (ignored) are left out.
    """
    device = device or next(net.parameters()).device
    was_training = net.training
    net.eval()
    total_loss, total, correct, confusion = 0.0, 0, 0, None
    for X, y in data:
        X, y = X.to(device), y.to(device)
        outputs = net(X)
        total_loss += loss_fn(outputs, y).item() * len(X)
        total += len(X)
        pred = outputs.argmax(dim=1)
        if y.ndim > 1:  # segmentation: accumulate a confusion matrix over labelled pixels
            k = num_classes or outputs.shape[1]
            keep = y != 255
            counts = torch.bincount(y[keep] * k + pred[keep], minlength=k * k)
            confusion = counts if confusion is None else confusion + counts
        else:
            correct += (pred == y).sum().item()
    net.train(was_training)
    metrics = {"loss": total_loss / total}
    if confusion is not None:
        metrics.update(segmentation_scores(confusion.reshape(k, k).cpu()))
    else:
        metrics["accuracy"] = correct / total
    return metrics


def make_optimizer(net: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """Return the optimiser ``config`` names (SGD, Adam, LARS or LAMB) over ``net``'s parameters."""
    if config.optimizer == "adam":
        return torch.optim.Adam(net.parameters(), lr=config.lr)
    if config.optimizer == "lars":
        return LARS(net.parameters(), lr=config.lr, momentum=config.momentum)
    if config.optimizer == "lamb":
        return LAMB(net.parameters(), lr=config.lr)
    return torch.optim.SGD(net.parameters(), lr=config.lr, momentum=config.momentum)


def fit(
    net: nn.Module,
    train_set: Dataset,
    config: TrainConfig,
    *,
    test_set: Dataset | None = None,
    loss_fn: Callable | None = None,
    device: torch.device | str | None = None,
    sampler: Sampler | None = None,
    grad_hook: Callable[[nn.Module], None] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    progress: bool = True,
    checkpoint: ckpt_lib.CheckpointConfig | str | os.PathLike | None = None,
    resume_from: str | os.PathLike | None = None,
    comm: object | None = None,
) -> History:
    """Train ``net`` in place with mini-batch SGD (or Adam) and return its :class:`History`.

    Args:
        sampler: e.g. a :class:`course_lib.data.ShardSampler` (its ``set_epoch`` is called);
            default: reshuffle the whole set every epoch from ``config.seed``.
        grad_hook: called as ``grad_hook(net)`` after backward, before the optimiser step —
            the place where data parallelism averages gradients.
        optimizer: an optimiser already built over ``net``'s parameters (data parallelism adds
            timing hooks to it, or shards it); default: :func:`make_optimizer` from ``config``.
        progress: show a progress bar over epochs (tqdm: a widget in Jupyter, text in a terminal).
        checkpoint: a folder (or a :class:`course_lib.checkpoint.CheckpointConfig`): save the
            whole training state there after every epoch (and every ``every_steps`` steps).
        resume_from: a checkpoint file, or a folder (its newest): continue that run, bit for
            bit as if it had not stopped; ``config`` must match it except ``num_epochs``/target.
        comm: the communicator when this process is one rank of a data-parallel run: every
            rank calls fit, checkpoints gather every rank's state and rank 0 alone writes; on
            resume every rank reads the same file (see :mod:`course_lib.checkpoint`).
    """
    from tqdm.auto import tqdm

    device = torch.device(device) if device is not None else default_device()
    net.to(device)
    loss_fn = loss_fn or nn.CrossEntropyLoss(ignore_index=255)
    if optimizer is None:
        optimizer = make_optimizer(net, config)
    generator = torch.Generator().manual_seed(config.seed)

    def loader(batch_size: int) -> DataLoader:
        return DataLoader(
            train_set,
            batch_size=batch_size,
            sampler=sampler,
            shuffle=sampler is None,
            generator=generator,
        )

    train_loader = loader(config.batch_size)
    test_loader = DataLoader(test_set, batch_size=256) if test_set is not None else None
    history = History()
    saver = ckpt_lib.CheckpointConfig.of(checkpoint)
    resume = None
    if resume_from is not None:
        resume = ckpt_lib.resume_run(
            resume_from, net, optimizer, config, generator, sampler, history, comm=comm
        )
    first_epoch = resume["epochs_done"] + 1 if resume is not None else 1
    schedule, steps_per_epoch = config.lr_schedule, len(train_loader)
    if schedule is not None:
        schedule.check(config.num_epochs, steps_per_epoch)
        # The schedule scales with the run's global batch: a data-parallel rank's sampler
        # knows it (each rank trains on global / world size); one process's is its own.
        global_batch = getattr(sampler, "global_batch", None) or config.batch_size
    bar = tqdm(
        range(first_epoch, config.num_epochs + 1), desc="epoch", disable=not progress, leave=True
    )
    for epoch in bar:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch - 1)
        if config.batch_schedule is not None:  # a larger batch instead of a smaller lr
            train_loader = loader(config.batch_size * config.batch_schedule.factor_at(epoch))
        net.train()
        start, seen, total_loss = time.perf_counter(), 0, 0.0
        # A mid-epoch checkpoint keeps the loader's generator as the epoch began: a resumed run
        # replays the epoch's order from it and skips the steps already done.
        epoch_start_loader, batches, step = generator.get_state(), iter(train_loader), 0
        if resume is not None and resume["steps_done"]:
            step, seen, total_loss = ckpt_lib.skip_done_steps(
                batches, resume, getattr(comm, "rank", 0)
            )
        resume = None
        for X, y in batches:
            step_start = time.perf_counter()
            X, y = X.to(device), y.to(device)
            loss, _ = compute_gradients(net, X, y, loss_fn)
            if grad_hook is not None:
                grad_hook(net)
            if schedule is not None:
                lr = schedule.lr_at(
                    (epoch - 1) * steps_per_epoch + step,
                    base_lr=config.lr,
                    batch_size=global_batch,
                    steps_per_epoch=steps_per_epoch,
                )
                for group in optimizer.param_groups:
                    group["lr"] = lr
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()  # GPU work is asynchronous: wait before reading a clock
            history.step_times.append(time.perf_counter() - step_start)
            total_loss += loss * len(X)
            seen += len(X)
            step += 1
            if saver is not None and saver.due(step, len(train_loader)):
                ckpt_lib.save_run(
                    saver,
                    net,
                    optimizer,
                    config,
                    history,
                    epochs_done=epoch - 1,
                    steps_done=step,
                    loader=epoch_start_loader,
                    sampler=sampler,
                    seen=seen,
                    total_loss=total_loss,
                    comm=comm,
                )
        record = {"epoch": epoch, "epoch_time": time.perf_counter() - start}
        # Train metrics are measured after the epoch, on the weights the epoch ended with.
        eval_train = DataLoader(train_set, batch_size=256, sampler=sampler)
        record.update({f"train_{k}": v for k, v in evaluate(net, eval_train, loss_fn).items()})
        record["train_running_loss"] = total_loss / seen
        if test_loader is not None:
            record.update({f"test_{k}": v for k, v in evaluate(net, test_loader, loss_fn).items()})
        history.epochs.append(record)
        if saver is not None:
            ckpt_lib.save_run(
                saver,
                net,
                optimizer,
                config,
                history,
                epochs_done=epoch,
                steps_done=0,
                loader=generator,
                sampler=sampler,
                comm=comm,
            )
        bar.set_postfix(
            {k: round(v, 4) for k, v in record.items() if k.endswith(("loss", "accuracy"))}
        )
        if config.target is not None and record.get(config.target_metric, -np.inf) >= config.target:
            break
    return history
