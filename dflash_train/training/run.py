"""One training run inside a `train` process, built from its TrainConfig: data, targets,
drafter, optimizer, hidden-state source and monitor; resume if asked (resume.py), run the
step loop (loop.py), checkpoint and shut down. process.py owns the process around it."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_train.checkpoint import layout as checkpoint_layout
from dflash_train.checkpoint import store as checkpoints
from dflash_train.config import TrainConfig
from dflash_train.pipeline.async_checkpoint import AsyncCheckpointer
from dflash_train.pipeline.compile_warm_up import (
    compile_before_workers,
    kernels_in_use,
    warm_up_shapes,
)
from dflash_train.pipeline.control_watch import ControlWatcher, read_control_rev
from dflash_train.pipeline.distributed import RankGroup, RankInfo, shard_devices
from dflash_train.pipeline.monitor import MonitorIntervals, MonitorThread
from dflash_train.pipeline.pool import HiddenStatePool
from dflash_train.pipeline.progress_line import ProgressLine, step_figures
from dflash_train.pipeline.run_dir_watch import RunDirWatch
from dflash_train.pipeline.sources import AsyncSource, BatchLoader, SyncSource
from dflash_train.pipeline.stage_timers import StageTimers
from dflash_train.protocol import init_from_text
from dflash_train.rundir import RunDir
from dflash_train.stream.beat import Beat
from dflash_train.stream.eval_inbox import EvalInbox
from dflash_train.stream.writer import StatusWriter
from dflash_train.targets.linear_attention import fallback_warning
from dflash_train.training import init_weights, resume
from dflash_train.training.heldout_eval import HeldoutEvaluator
from dflash_train.training.loop import Progress, run_epochs
from dflash_train.training.stop_flag import StopFlag

if TYPE_CHECKING:
    import torch

    from dflash_train.data.buckets import BatchPlanStats
    from dflash_train.data.dataset import TokenDataset
    from dflash_train.model.drafter import DFlashDrafter
    from dflash_train.model.mask_token import MaskChoice
    from dflash_train.pipeline.drafter_step import DrafterStepper
    from dflash_train.targets.frozen_target import Target

# Lines while compiling before the first step: as often as the monitor's heartbeat, for at
# most half an hour (replicas compile one after another; a warm-up longer than that has hung).
WARM_UP_BEAT_S = 5.0
WARM_UP_LIMIT_S = 1800.0


class TrainingRun:
    def __init__(
        self,
        config: TrainConfig,
        run_dir: RunDir,
        run_id: str,
        writer: StatusWriter | None,
        rank: RankInfo,
        stop: StopFlag,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.run_id = run_id
        self.writer = writer
        self.rank = rank
        self.stop = stop
        self.progress = Progress()  # the loop advances it; a checkpoint records it
        self.settings = config.live_settings()
        # Revisions written before this process took the lock belong to an earlier run.
        self.control_rev = read_control_rev(run_dir.control)
        self.last_saved_step: int | None = None
        self.timers = StageTimers()
        self.monitor: MonitorThread | None = None
        self.progress_line: ProgressLine | None = None  # train's stderr, on rank 0
        self.source: SyncSource | AsyncSource | None = None
        self.pool: HiddenStatePool[Any] | None = None  # the async pipeline's
        self.group: RankGroup | None = None
        self.wandb: Any = None
        self.resumed_from: str | None = None
        self.resumed_run: str | None = None
        self.resume_path: Path | None = None
        # --init-from, unless a resume wins
        self.init_source: checkpoint_layout.InitSource | None = None
        self.initialised_from: dict[str, Any] | None = None
        self.mask_reason = ""
        self._plan_cache: tuple[int, list[list[int]]] | None = None
        self._checkpointer: AsyncCheckpointer | None = None
        # What setup() builds, in its order (declared here, set there: each needs the one
        # before it, and none is used before setup has returned).
        self.all_target_devices: list[str]
        self.all_drafter_devices: list[str]
        self.device: torch.device
        self.target_devices: list[torch.device]
        self.checkpoint_dir: Path
        self.target_identity: str
        self.dataset: TokenDataset
        self.batches_per_epoch: int
        self.batch_stats: BatchPlanStats
        self.total_steps: int
        self.targets: list[Target]
        self.embed_tokens: torch.nn.Module
        self.lm_head: torch.nn.Module
        self.layer_ids: list[int]
        self.feature_layer_ids: list[int]
        self.drafter: DFlashDrafter
        self.stepper: DrafterStepper
        self.compile_report: dict[str, Any]
        self.heldout = HeldoutEvaluator(self)

    # -- set-up -------------------------------------------------------------------------
    def setup(self) -> None:
        import torch

        from dflash_train.data.buckets import length_buckets

        config = self.config
        cuda = torch.cuda.is_available()
        drafters = config.pipeline.drafter_gpus or (("cuda:0",) if cuda else ("cpu",))
        targets = config.pipeline.target_gpus or drafters
        self.all_target_devices = [str(torch.device(d)) for d in targets]
        self.all_drafter_devices = [str(torch.device(d)) for d in drafters]
        self.device = torch.device(drafters[self.rank.rank])
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        from dflash_train.model.dflash_loss import ce_kernel_refusal, set_ce_kernel

        refusal = ce_kernel_refusal(config.model.ce_kernel, self.device)
        if refusal is not None:  # before any data or model is loaded
            raise ValueError(refusal)
        set_ce_kernel(config.model.ce_kernel)
        if self.rank.distributed:
            self.group = RankGroup(self.rank, self.device)
        self.target_devices = [
            torch.device(d)
            for d in shard_devices(list(targets), self.rank.rank, self.rank.world_size)
        ]
        torch.manual_seed(config.optimiser.seed)

        self.checkpoint_dir = checkpoint_layout.run_folder(self.run_dir.checkpoints, self.run_id)
        self.target_identity = checkpoint_layout.target_identity(config.train.target_model)
        if config.run.resume_from:
            self.resume_path = resume.find_resume(self, config.run.resume_from)
        if config.run.init_from and self.resume_path is None:
            self.init_source = checkpoint_layout.find_init_source(config.run.init_from, config)
        self._load_data()
        self._load_models(torch)
        self._build_stepper()
        if self.resume_path is not None:
            resume.resume(self, self.resume_path)
        pad_id = self.targets[0].tokenizer.pad_token_id
        max_length = config.model.max_length
        loader = BatchLoader(
            self.dataset,
            max_length,
            0 if pad_id is None else int(pad_id),
            length_buckets(self.dataset.lengths.clip(max=max_length), config.model.num_buckets),
            pin=any(d.type == "cuda" for d in self.target_devices),
            timers=self.timers,
        )
        if config.pipeline.pipeline == "sync":
            self.source = SyncSource(
                loader,
                self.targets[0],
                layer_ids=self.feature_layer_ids,
                drafter_device=self.device,
                timers=self.timers,
            )
        else:
            self.pool = HiddenStatePool(
                self.settings["hs_queue_depth"],
                self.settings["hs_min_ready"],
                seed=config.optimiser.seed,
            )
            self.source = AsyncSource(
                loader,
                self.targets,
                layer_ids=self.feature_layer_ids,
                drafter_device=self.device,
                timers=self.timers,
                pool=self.pool,
            )
        self._start_monitor()
        self.heldout.load()
        self._write_run_start()
        self._compile_before_workers()

    def _load_data(self) -> None:
        from dflash_train.data.buckets import batch_plan_stats
        from dflash_train.data.dataset import load_data_dirs

        config = self.config
        self.dataset = load_data_dirs(config.train.data_dir)
        print(f"{len(self.dataset)} samples loaded from {config.train.data_dir}", file=sys.stderr)
        first = self.plan(0)
        self.batches_per_epoch = len(first)
        self.batch_stats = batch_plan_stats(self.dataset.lengths, first, config.model.max_length)
        print(self.batch_stats.describe(), file=sys.stderr)
        start = checkpoints.read_state(self.resume_path) if self.resume_path else None
        self.total_steps = resume.planned_steps(
            self.plan,
            config.optimiser.epochs,
            self.rank.world_size,
            start,
            limit=config.optimiser.max_steps,
        )

    def plan(self, epoch: int) -> list[list[int]]:
        """The epoch's batches (sample indices). Only the latest epoch's plan is kept, so
        memory does not grow with the number of epochs."""
        from dflash_train.data.buckets import bucketed_batches

        if self._plan_cache is None or self._plan_cache[0] != epoch:
            model = self.config.model
            order = bucketed_batches(
                self.dataset.lengths,
                tokens_per_batch=model.tokens_per_batch,
                epoch=epoch,
                seed=self.config.optimiser.seed,
                num_buckets=model.num_buckets,
                max_length=model.max_length,
            )
            self._plan_cache = (epoch, order)
        return self._plan_cache[1]

    def _load_models(self, torch: Any) -> None:
        from dflash_train.targets.frozen_target import load_target

        self.targets = []
        fp8 = self.config.pipeline.target_dtype == "fp8"
        if fp8:
            from dflash_train.targets.fp8 import fp8_refusal, quantise_target_fp8

            refusals = filter(None, map(fp8_refusal, self.target_devices))
            reason = next(refusals, None)
            if reason is not None:  # before any model is built
                raise ValueError(reason)
        for device in self.target_devices:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            target = load_target(self.config.train.target_model, device, dtype)
            if fp8:
                quantise_target_fp8(target)
            self.targets.append(target)
        first = self.targets[0]
        # The drafter uses the target's frozen embedding and lm_head on its own device.
        if first.device == self.device:
            self.embed_tokens, self.lm_head = first.embed_tokens, first.lm_head
        else:
            import copy

            self.embed_tokens = copy.deepcopy(first.embed_tokens).to(self.device)
            self.lm_head = copy.deepcopy(first.lm_head).to(self.device)

    def _build_stepper(self) -> None:
        from dflash_train.model.drafter import DFlashDrafter, drafter_config_for_target
        from dflash_train.pipeline.drafter_step import DrafterStepper, StepConfig
        from dflash_train.targets.frozen_target import context_layer_count

        model, optimiser = self.config.model, self.config.optimiser
        target = self.targets[0]
        drafter_config = drafter_config_for_target(
            target,
            num_layers=model.draft_layers,
            block_size=model.block_size,
            num_context_layers=context_layer_count(target.num_layers, model.target_layers),
            mask=self._mask_choice(),
        )
        if self.resume_path is not None:
            resume.check_resumed_shape(self, drafter_config)
        self.layer_ids = list(drafter_config.target_layer_ids)
        # What the target workers extract: the drafter's context layers, then (distillation)
        # the final layer, whose normed hidden states make the target's own logits.
        self.feature_layer_ids = self.layer_ids + (
            [target.num_layers - 1] if optimiser.distill > 0 else []
        )
        self.drafter = DFlashDrafter(drafter_config, attention_backend=model.attention)
        self.drafter = self.drafter.to(self.device)
        if self.init_source is not None:  # before DDP, which spreads rank 0's weights
            self.initialised_from = init_weights.load_into(self.drafter, self.init_source)
        wrapped: Any = self.drafter
        if self.group is not None:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            wrapped = DistributedDataParallel(self.drafter, device_ids=ids)
        step_config = StepConfig(
            lr=optimiser.lr,
            weight_decay=optimiser.weight_decay,
            warmup_steps=math.ceil(optimiser.warmup_ratio * self.total_steps),
            total_steps=self.total_steps,
            grad_clip=optimiser.grad_clip,
            block_size=model.block_size,
            num_anchors=model.num_anchors,
            seed=optimiser.seed,
            distill=optimiser.distill,
        )
        self.stepper = DrafterStepper(
            wrapped,
            self.drafter,
            embed_tokens=self.embed_tokens,
            lm_head=self.lm_head,
            config=step_config,
            device=self.device,
            timers=self.timers,
        )

    def _mask_choice(self) -> MaskChoice:
        from dflash_train.model.drafter import read_drafter_config
        from dflash_train.model.mask_token import (
            MaskChoice,
            choose_mask,
            parse_mask_request,
            refuse_seen_mask,
            tokens_seen,
        )

        target = self.targets[0]
        # Only a table without a spare row needs the data scanned (one pass over input_ids).
        needs_scan = getattr(target.tokenizer, "mask_token_id", None) is None and (
            target.vocab_size <= len(target.tokenizer)
        )
        seen = tokens_seen(self.dataset.table, target.vocab_size) if needs_scan else None
        if self.resume_path is not None:  # the drafter was trained with the checkpoint's
            saved = read_drafter_config(self.resume_path)
            kept = MaskChoice(saved.mask_mode, saved.mask_token_id, "the resumed checkpoint's")
            # The run's data may have changed since (a restart with another --data-dir).
            refuse_seen_mask(kept, seen, "resume_from", self.resume_path)
            return kept
        if self.init_source is not None:  # the weights learned with their mask token
            choice = init_weights.mask_choice(self.init_source, seen)
        else:
            request = parse_mask_request(self.config.model.mask_token)
            choice = choose_mask(target.tokenizer, target.vocab_size, seen, request)
        self.mask_reason = choice.reason
        print(f"mask: {choice.reason}", file=sys.stderr)
        return choice

    def _start_monitor(self) -> None:
        from dflash_train.pipeline.wandb_log import WandbLogger, split_tags

        config = self.config
        control = ControlWatcher(
            self.run_dir.control,
            current=lambda: dict(self.settings),
            apply=self._apply_settings,
            baseline_rev=self.control_rev,
        )
        if config.run.wandb_project and self.rank.is_main:
            self.wandb = WandbLogger(
                project=config.run.wandb_project,
                run_dir=self.run_dir.root,
                run_id=self.run_id,
                config=config.flat_record(),
                entity=config.run.wandb_entity,
                name=config.run.wandb_name,
                tags=split_tags(config.run.wandb_tags),
                group=config.run.wandb_group,
            )
        # Rank 0's monitor reports every GPU of the run, the other ranks' ones too.
        roles = gpu_roles(self.all_target_devices, self.all_drafter_devices)
        cuda = tuple({d for d in [*self.target_devices, self.device] if d.type == "cuda"})
        self.monitor = MonitorThread(
            self.writer,
            block_size=config.model.block_size,
            max_bad_steps=config.run.max_bad_steps,
            on_fatal=lambda message: self.stop.request("error", message),
            timers=self.timers,
            pool=self.pool,
            settings=lambda: dict(self.settings),
            producers=len(self.targets),
            control=control,
            intervals=MonitorIntervals(
                profile=config.run.profile_interval, stall=config.run.stall_after
            ),
            gpu_roles=roles,
            allocator_devices=cuda,
            wandb=self.wandb,
            eval_inbox=EvalInbox(self.run_dir) if self.rank.is_main else None,
            run_dir_watch=RunDirWatch(self.run_dir.root, self.run_dir.status),
            on_orphaned=self._orphaned,
            on_step=self._show_step if self.rank.is_main else None,
        )

    def _show_step(self, fields: dict[str, Any]) -> None:
        """One progress line per step line (every --log-every steps), on the monitor's thread."""
        if self.progress_line is None:
            self.progress_line = ProgressLine("step", self.total_steps)
        self.progress_line.update(fields["step"], step_figures(fields))

    def _orphaned(self, reason: str) -> None:
        print(f"stopping: {reason}; writing nothing more there", file=sys.stderr)
        self.stop.request("orphaned", reason)

    def _apply_settings(self, updates: dict[str, int]) -> None:
        merged = {**self.settings, **updates}
        if self.pool is not None:
            self.pool.set_limits(depth=merged["hs_queue_depth"], min_ready=merged["hs_min_ready"])
        self.settings = merged

    def _write_run_start(self) -> None:
        if self.writer is None:
            return
        dataset = {**self.dataset.stats.as_dict(), **self.batch_stats.as_dict()}
        compile_target = self.config.pipeline.compile_target
        kernels = kernels_in_use(
            self.drafter.attention_backend, self.device, self.targets, compile_target,
            self.config.pipeline.target_dtype, self.config.model.compile_drafter,
            self.config.optimiser.distill,
        )  # fmt: skip
        self.writer.write(
            "run_start",
            config=self.config.flat_record(),
            topology={
                "target": self.all_target_devices,
                "drafter": self.all_drafter_devices,
                "world_size": self.rank.world_size,
                # Seconds each of this process's target replicas took to load.
                "target_load_s": [t.load_seconds for t in self.targets],
                "pipeline": self.config.pipeline.pipeline,
            },
            dataset=dataset,
            batches_per_epoch=self.batches_per_epoch,
            total_steps=self.total_steps,
            pid=os.getpid(),
            host=socket.gethostname(),
            resumed_from=self.resumed_from,
            resumed_run=self.resumed_run,
            init_from=self.initialised_from,
            checkpoint_dir=str(self.checkpoint_dir),
            mask={
                "mode": self.drafter.config.mask_mode,
                "token_id": self.drafter.config.mask_token_id,
                "reason": self.mask_reason,
            },
            start_step=self.progress.step,
            settings=dict(self.settings),
            layer_ids=self.layer_ids,
            kernels=kernels,
        )
        if self.initialised_from is not None:
            message = f"drafter initialised from the {init_from_text(self.initialised_from)}"
            print(message, file=sys.stderr)
            self.writer.write("event", level="info", code="init_from", message=message)
        warning = fallback_warning(kernels["target_layer_paths"] or {})
        if warning is not None:
            print(f"warning: {warning}", file=sys.stderr)
            self.writer.write("event", level="warning", code="target_fallback", message=warning)

    def _compile_before_workers(self) -> None:
        """Before any worker thread exists (compile_warm_up.py says why)."""

        def emit(kind: str, **fields: Any) -> None:
            # Later, a compile mid-run says so from the thread that met the new shape: the
            # monitor, the writer while training runs, writes it in order.
            if self.monitor is not None and self.monitor.is_alive():
                self.monitor.emit(kind, **fields)
            elif self.writer is not None:
                with self.stop.uninterruptible():  # the main thread's warm-up
                    self.writer.write(kind, **fields)

        model = self.config.model
        shapes = warm_up_shapes(
            self.dataset.lengths, self.plan(self.progress.epoch), model.max_length,
            model.num_anchors, model.block_size,
        )  # fmt: skip
        # The monitor starts with the loop: until then a Beat keeps the stream alive, or a
        # warm-up of minutes reads as a stall (stream/beat.py). It reports the monitor's GPUs.
        assert self.monitor is not None
        roles = self.monitor.gpu_roles
        # A stop while this compiles ends the run at once (stop_flag.StopDuringWarmUp): on a
        # GPU it can take minutes, and no step has run yet.
        with (
            self.stop.interruptible(),
            Beat(self.writer, roles, WARM_UP_BEAT_S, WARM_UP_LIMIT_S, "warm-up-beat")
            if self.writer is not None
            else contextlib.nullcontext(),
        ):
            self.compile_report = compile_before_workers(
                targets=self.targets,
                layer_ids=self.feature_layer_ids,
                stepper=self.stepper,
                attention_backend=self.drafter.attention_backend,
                shapes=shapes,
                emit=emit,
                compile_target=self.config.pipeline.compile_target,
                compile_drafter_layers=model.compile_drafter,
            )
        if self.rank.is_main:
            self.checkpointer()  # starts pinning the host copies in the background

    # -- the loop -----------------------------------------------------------------------
    def loop(self) -> str:
        """Train until done or stopped; returns the run_end reason."""
        assert self.monitor is not None and self.source is not None
        self.monitor.mark_start()
        self.monitor.start()
        try:
            return run_epochs(self)
        finally:
            self.shutdown()

    def save(self) -> None:
        """Checkpoint now (rank 0 writes; the others only take part in gathering)."""
        if self.progress.step == 0:
            return  # nothing trained yet (a stop during loading): no checkpoint to keep
        if self.monitor is not None:
            self.monitor.touch()
        consumed = sorted(self.progress.consumed)
        if self.group is not None:
            consumed = self.group.union(consumed)
        if not self.rank.is_main or self.last_saved_step == self.progress.step:
            return
        if self.monitor is not None and self.monitor.check_run_dir() is not None:
            return  # an orphan writes nothing: the run stops at its next step
        state = checkpoints.TrainState(
            step=self.progress.step,
            epoch=self.progress.epoch,
            consumed=consumed,
            tokens_seen=self.progress.tokens_seen,
            run_id=self.run_id,
            settings=dict(self.settings),
            control_rev=self.monitor.control.last_rev
            if self.monitor and self.monitor.control
            else None,
            target=self.target_identity,
        )
        # Pinned host copies now, the write on a background thread (async_checkpoint.py);
        # a failed earlier write is raised here, as a failed save always was.
        self.checkpointer().save(
            self.checkpoint_dir,
            state,
            checkpoints.capture_rng([self.device, *self.target_devices]),
            self.config.run.keep_checkpoints,
            within=self.run_dir.root,
        )
        self.last_saved_step = self.progress.step

    def checkpointer(self) -> AsyncCheckpointer:
        if self._checkpointer is None:

            def done(path: Any, state: Any, stall: float, write_s: float) -> None:
                if self.monitor is not None:
                    self.monitor.emit(
                        "checkpoint", step=state.step, path=str(path), seconds=round(write_s, 3),
                        stall_s=round(stall, 3),
                    )  # fmt: skip

            def failed(state: Any, exc: BaseException) -> None:
                # Said as an event before the run ends with the error (the run_end follows),
                # unless the run dir went meanwhile: then the run ends an orphan, silently.
                if self.monitor is not None and self.monitor.check_run_dir() is None:
                    self.monitor.emit(
                        "event", level="error", code="checkpoint_failed", message=str(exc),
                        step=state.step,
                    )  # fmt: skip

            self._checkpointer = AsyncCheckpointer(
                self.drafter, self.stepper.optimizer, self.stepper.scheduler, done, failed
            )
        return self._checkpointer

    def wait_for_checkpoint(self) -> None:
        """The write in flight is on disk (or its failure raised) when this returns."""
        if self._checkpointer is not None:
            self._checkpointer.wait()

    def shutdown(self) -> None:
        if self.source is not None:
            self.source.close()
        try:
            self.wait_for_checkpoint()  # a SIGTERM ends with a complete checkpoint
        finally:
            self._shutdown_rest()

    def _shutdown_rest(self) -> None:
        if self.monitor is not None and self.monitor.is_alive():
            self.monitor.stop()
        if self.progress_line is not None:
            self.progress_line.close()
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None
        if self.group is not None:
            self.group.close()
            self.group = None


def gpu_roles(target_devices: list[str], drafter_devices: list[str]) -> dict[int, str]:
    """GPU index -> "target", "drafter" or "target+drafter" for the `gpu` lines."""
    roles: dict[int, list[str]] = {}
    for role, devices in (("target", target_devices), ("drafter", drafter_devices)):
        for device in devices:
            if device.startswith("cuda:"):
                kinds = roles.setdefault(int(device.split(":", 1)[1]), [])
                if role not in kinds:
                    kinds.append(role)
    return {index: "+".join(kinds) for index, kinds in roles.items()}
