"""Stage 3, masked SFT: learn the CoA trajectories, never the tool outputs.

The whole idea is ONE function, `encode_example`: render prompt + trajectory, tokenize
with character offsets, and set the label of every token that overlaps the prompt or an
<observation> span to -100 (PyTorch's ignore index). Offsets instead of marker-token
matching make the mask independent of how BPE merges `</` with its neighbours (the AFM
release's issue #15). RL reuses the same span logic through the rollout masks.

Training itself is transformers' Trainer on the pre-tokenized (input_ids, labels) rows, with
a LoRA (CPU, one GPU) or the full model (multi-node preset, under `accelerate launch` with
DeepSpeed/FSDP). Each batch is packed into one row (`pack_batch`, coa_lab/training/packing.py): the
examples' shared system instruction is computed once and no padding at all; the loss equals
the padded batch's (tests/training/test_sft_loss.py). Why not TRL's SFTTrainer: in TRL 1.15 its loss always goes through a fused
LM head built on Triton kernels (trl/trainer/utils.py), which CPU builds of torch lack, so
it cannot run the laptop demo; the plain Trainer runs the same code on CPU and GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from coa_lab import distributed
from coa_lab.config import Preset
from coa_lab.generation.models import cpu_autocast_enabled, effective_dtype, load_model
from coa_lab.progress import progress_bar
from coa_lab.prompts import task_messages
from coa_lab.protocol import PROFILE_TOOLS, observation_spans
from coa_lab.training import packing
from coa_lab.training.compiled_layers import compiled_layers
from coa_lab.training.lm_head import nll_at
from coa_lab.trajectories import TrajectoryRecord

IGNORE_INDEX = -100  # positions the cross-entropy loss skips
# transformers is imported inside the functions that build the Trainer: the pipeline imports this
# module for stages that never train SFT, and transformers' Trainer costs seconds (as decoding.py)


def encode_example(tokenizer, messages: list[dict], trajectory: str, max_length: int | None = None,
                   mask_observations: bool = True) -> dict:
    """(input_ids, labels) for one trajectory; labels are -100 on prompt and observation tokens.

    mask_observations=False keeps the observation tokens' labels (the ablation in notebook 07:
    the model then also learns to write tool output itself). `n_observation_tokens` counts the
    observation tokens either way."""
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    eos = tokenizer.eos_token or ""
    full = prompt + trajectory + eos  # the model must also learn to stop after </answer>
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    spans = [(s + len(prompt), e + len(prompt)) for s, e in observation_spans(trajectory)]
    labels, n_obs = [], 0
    for tok_id, (start, end) in zip(enc["input_ids"], enc["offset_mapping"]):
        in_prompt = start < len(prompt)
        in_obs = any(start < e and end > s for s, e in spans)  # any overlap masks the token
        n_obs += in_obs and not in_prompt
        labels.append(IGNORE_INDEX if in_prompt or (in_obs and mask_observations) else tok_id)
    ids = enc["input_ids"]
    if max_length is not None:
        ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "labels": labels, "n_observation_tokens": n_obs}


def record_messages(rec: TrajectoryRecord) -> list[dict]:
    """The prompt a record is trained under: exactly the one rollouts and eval use."""
    return task_messages(rec.profile, rec.question, list(PROFILE_TOOLS[rec.profile]))


def pad_batch(rows: list[dict], pad_id: int) -> dict:
    """Right-pad a list of (input_ids, labels) rows; padding gets label -100 and attention 0."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = [r["input_ids"] + [pad_id] * (width - len(r["input_ids"])) for r in rows]
    labels = [r["labels"] + [IGNORE_INDEX] * (width - len(r["labels"])) for r in rows]
    attn = [[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows]
    return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "attention_mask": torch.tensor(attn)}


def pack_batch(rows: list[dict], pad_id: int) -> dict:
    """One packed row for a batch (coa_lab/training/packing.py): examples that share a prompt prefix
    (the system instruction) compute it once, and no padding is computed. `labels` stay per
    example ([n, L], right-padded with -100) so the Trainer counts them as it does for
    `pad_batch`; `packed_index[i, t]` is the packed column of token t of example i."""
    packed = packing.pack([[r["input_ids"] for r in rows]], pad_id)
    width = max(len(r["input_ids"]) for r in rows)
    labels = [r["labels"] + [IGNORE_INDEX] * (width - len(r["labels"])) for r in rows]
    index = [cols.tolist() + [-1] * (width - len(cols)) for cols in packed.index]
    return {"input_ids": packed.input_ids, "position_ids": packed.position_ids, "allowed": packed.allowed,
            "labels": torch.tensor(labels), "packed_index": torch.tensor(index)}


def _packed_lm_loss(model, batch: dict):
    """Summed next-token cross-entropy of a `pack_batch` batch: target (i, t) is predicted at
    the packed column of token t-1 of example i; the LM head runs only on those columns."""
    labels, index = batch["labels"], batch["packed_index"]
    wanted = labels[:, 1:] != IGNORE_INDEX  # [n, L-1]
    columns = index[:, :-1][wanted]
    cols = [row[row >= 0] for row in index.cpu()]
    inputs = packing.model_inputs(model, batch["input_ids"], batch["position_ids"], batch["allowed"],
                                  packing.segments(cols, [0] * len(cols), 1))
    if not len(columns):
        return model(**inputs, logits_to_keep=1).logits.sum() * 0.0  # keeps the graph for backward
    return nll_at(model, inputs, torch.zeros_like(columns), columns, labels[:, 1:][wanted]).sum()


def masked_lm_loss(model, batch: dict, num_items_in_batch=None):
    """Next-token cross-entropy over the labelled tokens only, with the LM head run only from
    the first labelled position on, CHUNK positions at a time with recomputation in the backward
    (coa_lab/training/lm_head.py): no [tokens, V] logits tensor is ever stored. (Speed on the CPU demo: no measurable
    gain, benchmarks/bench_sft.py; the saving is memory, larger at long prompts and big
    vocabularies.) Summed and divided by
    `num_items_in_batch` when the Trainer counts labels across accumulation steps, else the
    mean over this batch's labels -- what transformers' own causal-LM loss computes. Takes a
    padded batch (`pad_batch`) or a packed one (`pack_batch`): the same loss either way."""
    labels = batch["labels"]
    if "packed_index" in batch:
        loss = _packed_lm_loss(model, batch)
    else:
        labelled = (labels != IGNORE_INDEX).any(dim=0).nonzero()
        length = labels.shape[1]
        start = max(1, int(labelled[0])) if len(labelled) else length - 1  # first position with a label
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        # positions start-1..L-2 predict tokens start..L-1; the head a chunk at a time (training/lm_head.py)
        columns = torch.arange(start - 1, length - 1, device=labels.device)
        rows = torch.arange(labels.shape[0], device=labels.device).repeat_interleave(len(columns))
        loss = nll_at(model, inputs, rows, columns.repeat(labels.shape[0]), labels[:, start:].reshape(-1),
                      ignore_index=IGNORE_INDEX).sum()
    if num_items_in_batch is None:
        num_items_in_batch = (labels[:, 1:] != IGNORE_INDEX).sum()  # position 0 predicts nothing
    return loss / torch.as_tensor(num_items_in_batch, device=loss.device).clamp(min=1)


def collator(model, pad_id: int):
    """The batch builder for `model`: packed where its attention takes a 4D mask (sdpa, eager,
    the CPU sdpa), padded otherwise (flash-attention, or any model under unsloth, which drops the
    mask in train mode: packing.supported). benchmarks/bench_sft.py measures both."""
    if packing.supported(model):
        return lambda rows: pack_batch(rows, pad_id)
    return lambda rows: pad_batch(rows, pad_id)


def masked_trainer():
    """transformers' Trainer with `masked_lm_loss`."""
    from transformers import Trainer
    from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

    class MaskedLMTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = masked_lm_loss(model, inputs, num_items_in_batch)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                # num_items_in_batch counts every rank's labels, and DDP averages the gradients:
                # scale back, as Trainer.compute_loss does
                loss = loss * self.accelerator.num_processes
            return (loss, None) if return_outputs else loss

        def _load_optimizer_and_scheduler(self, checkpoint):
            if checkpoint is None or torch.cuda.is_available() or self.args.world_size <= 1:
                return super()._load_optimizer_and_scheduler(checkpoint)
            # CPU ranks under `accelerate launch` (gloo): transformers maps the optimizer state to
            # args.device, "cpu:0", a location torch.load cannot restore to; the state is CPU-resident
            # anyway (tests/e2e/test_distributed.py resumes SFT on two CPU ranks)
            self.optimizer.load_state_dict(torch.load(os.path.join(checkpoint, OPTIMIZER_NAME), map_location="cpu",
                                                      weights_only=True))
            self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))

    return MaskedLMTrainer


def progress_callback():
    """A tqdm.auto bar over optimizer steps with the latest loss (a widget in notebooks, a bar
    in a terminal); the Trainer's own bar is off because it also prints every log dict."""
    from transformers import TrainerCallback

    class TqdmProgress(TrainerCallback):
        bar = None

        def on_train_begin(self, args, state, control, **kwargs):
            # one bar per run, not per rank
            self.bar = progress_bar(total=state.max_steps, desc="sft", unit="step", disable=not state.is_world_process_zero)

        def on_step_end(self, args, state, control, **kwargs):
            self.bar.update(state.global_step - self.bar.n)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.bar is not None and logs and "loss" in logs:
                self.bar.set_postfix(loss=f"{logs['loss']:.3f}")

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

    return TqdmProgress()


@dataclass
class SFTResult:
    adapter_dir: Path
    losses: list[float]
    n_examples: int
    trained_tokens: int  # tokens with a label (the loss sees these)
    masked_observation_tokens: int
    total_tokens: int = 0  # every token fed forward, masked or not
    train_seconds: float = 0.0  # the optimisation loop alone (no model loading)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest `trainer/checkpoint-N` folder of an SFT run, or None."""
    found = [p for p in (Path(out_dir) / "trainer").glob("checkpoint-*") if p.name.split("-")[-1].isdigit()
             and (p / "trainer_state.json").exists()]
    return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None


def train_sft(preset: Preset, records: list[TrajectoryRecord], out_dir: str | Path, resume: bool = False,
              callbacks: list | None = None) -> SFTResult:
    """Fine-tune the preset's model on `records` with observation masking; saves the adapter.

    Every `sft.save_steps` optimizer steps a checkpoint goes to out_dir/trainer/checkpoint-N
    (transformers' format: adapter, optimizer, scheduler, step, RNG states; the data order is
    the seeded sampler's, and a resumed run skips the batches already seen). resume=True
    continues from the newest checkpoint (the loss curve then includes the steps before it);
    with none there, it starts afresh. callbacks: extra transformers TrainerCallbacks."""
    from transformers import set_seed
    from transformers.trainer_callback import PrinterCallback

    if not records:
        raise ValueError("no trajectories to train on: distillation kept none (see the filter report)")
    distributed.init()  # under `accelerate launch`: each rank on its own GPU (or gloo on CPU)
    out_dir = Path(out_dir)
    cuda = torch.cuda.is_available()
    # The arguments before the model: under a DeepSpeed ZeRO-3 launch config they switch on
    # zero.Init, so from_pretrained loads each rank's shard instead of the whole model per GPU.
    args = _training_args(preset, out_dir, cuda, cpu_autocast_enabled(preset.model))

    set_seed(preset.seed)  # the LoRA initialisation depends on the seed alone (and not on what ran before)
    model, tokenizer = load_model(preset.model, trainable=True)
    rows, masked_obs = [], 0
    for rec in records:
        ex = encode_example(tokenizer, record_messages(rec), rec.text, preset.sft.max_length,
                            mask_observations=preset.sft.mask_observations)
        masked_obs += ex.pop("n_observation_tokens") if preset.sft.mask_observations else 0
        rows.append(ex)
    trainer = masked_trainer()(model=model, args=args, train_dataset=rows,  # a list of dicts is a map-style dataset
                      data_collator=collator(model, tokenizer.pad_token_id),
                      callbacks=[progress_callback(), *(callbacks or [])])
    trainer.remove_callback(PrinterCallback)  # its per-step log dicts: the bar shows the loss instead
    checkpoint = latest_checkpoint(out_dir) if resume else None
    with compiled_layers(model, preset.model):  # inductor's fused layers while training (training/compiled_layers.py)
        output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    adapter_dir = out_dir / "adapter"
    trainer.save_model(str(adapter_dir))  # rank 0 writes; FSDP / ZeRO-3 shards are gathered first
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(adapter_dir)
    distributed.barrier()  # the adapter is complete before any rank goes on to read it
    trained = sum(sum(1 for label in r["labels"] if label != IGNORE_INDEX) for r in rows)
    return SFTResult(adapter_dir, losses, len(rows), trained, masked_obs,
                     total_tokens=int(sum(len(r["input_ids"]) for r in rows) * preset.sft.epochs),
                     train_seconds=float(output.metrics.get("train_runtime", 0.0)))


def precision(preset: Preset, cuda: bool, cpu_bf16: bool) -> dict[str, bool]:
    """The Trainer's mixed precision. CPU: fp32 master weights with bf16 autocast where the CPU
    has bf16 units (models.compute_context). GPU: the preset's bf16, or loss-scaled fp16 on a card
    without bf16 (models.effective_dtype)."""
    dtype = effective_dtype(preset.model)
    return {"bf16": (cuda and dtype == "bfloat16") or (not cuda and cpu_bf16), "fp16": cuda and dtype == "float16"}


def _training_args(preset: Preset, out_dir: Path, cuda: bool, cpu_bf16: bool):
    """transformers' TrainingArguments for a preset. Under `accelerate launch` they also carry
    the launcher's engine (DDP, FSDP or DeepSpeed, from its config file): nothing here names one."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out_dir / "trainer"),
        num_train_epochs=preset.sft.epochs,
        per_device_train_batch_size=preset.sft.batch_size,
        gradient_accumulation_steps=preset.sft.grad_accum,
        learning_rate=preset.sft.learning_rate,
        warmup_steps=preset.sft.warmup_ratio,  # transformers 5: a float < 1 is a ratio
        lr_scheduler_type="cosine",
        logging_steps=1,
        save_strategy="steps" if preset.sft.save_steps > 0 else "no",
        save_steps=max(1, preset.sft.save_steps),
        save_total_limit=2,
        report_to="none",
        remove_unused_columns=False,
        **precision(preset, cuda, cpu_bf16),
        use_cpu=not cuda,
        seed=preset.seed,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,  # every trainable (LoRA or full) weight is in every forward
        disable_tqdm=True,
    )

