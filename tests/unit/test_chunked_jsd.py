"""opd's chunked generalized JSD (trainer_kit/chunked_jsd.py, issue 49 item 1) against TRL's own
GKDTrainer.generalized_jsd_loss on the full logits: loss and the student's LoRA gradients within 1e-4, for beta 0,
0.5 and 1, with a label mask (prompt and padding) and with and without `num_items_in_batch`; the teacher's head
longer than the tokenizer (as Qwen2.5-7B's is beside 1.5B's) is cut to it."""

from __future__ import annotations

import pytest
import torch

from medgpt_ray import models
from medgpt_ray.trainer_kit.chunked_jsd import ChunkedJSD, add_hidden_state_output, head_weight

EXTRA_ROWS = 64  # the teacher's head past the tokenizer, as checkpoints pad theirs


@pytest.fixture(scope="module")
def pair(tiny_model):
    """A LoRA student (the tiny model, adapters made non-zero so they matter) and a different, frozen teacher whose
    head has EXTRA_ROWS more rows than the tokenizer."""
    from peft import get_peft_model

    from medgpt_ray.config import LoraConfig

    torch.manual_seed(0)
    base = models.load_causal_lm(tiny_model, "fp32", "lora")
    add_hidden_state_output(base)  # as the stage does, before PEFT
    student = get_peft_model(base, models.lora_config(LoraConfig(rank=4, alpha=8, dropout=0.0), "CAUSAL_LM", base))
    with torch.no_grad():
        for name, p in student.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    teacher = models.load_causal_lm(tiny_model, "fp32", "full")
    vocab = teacher.config.vocab_size
    teacher.resize_token_embeddings(vocab + EXTRA_ROWS)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    teacher.requires_grad_(False)
    return student.train(), teacher.eval(), vocab


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    """Two rows, right-padded: prompts (no target) then answers; the second row shorter."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, vocab, (2, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 31:] = 0
    labels = ids.clone()
    labels[0, :12] = -100
    labels[1, :20] = -100
    labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _reference(student, teacher, batch, vocab: int, beta: float, items) -> torch.Tensor:
    from trl.experimental.gkd import GKDTrainer

    s = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1, :vocab]
    with torch.no_grad():
        t = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1, :vocab]
    return GKDTrainer.generalized_jsd_loss(s, t, labels=batch["labels"][:, 1:], beta=beta, num_items_in_batch=items)


def _chunked(student, teacher, batch, vocab: int, beta: float, items) -> torch.Tensor:
    trainer = ChunkedJSD()  # the mixin's compute_loss alone, with what GKDTrainer would hold
    trainer.teacher_model, trainer.beta, trainer.vocab_size = teacher, beta, vocab
    return trainer.compute_loss(student, batch, num_items_in_batch=items)


def _grads(student, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    student.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("items", [None, 37])
def test_the_chunked_loss_and_gradients_are_gkds(pair, beta, items):
    student, teacher, vocab = pair
    batch = _batch(vocab)
    want = _reference(student, teacher, batch, vocab, beta, items)
    want_grads = _grads(student, want)
    got = _chunked(student, teacher, batch, vocab, beta, items)
    got_grads = _grads(student, got)
    assert got.item() == pytest.approx(want.item(), abs=1e-4) and want.item() > 1e-3
    assert got_grads.keys() == want_grads.keys() and all("lora_" in n for n in got_grads) and len(got_grads) > 4
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-4, rtol=1e-3, msg=name)


def test_the_teachers_longer_head_is_cut_to_the_tokenizer(pair):
    """TRL's GKD loss on the uncut logits fails on this pair (the stack of two vocabularies); cut, it is the loss."""
    from trl.experimental.gkd import GKDTrainer

    student, teacher, vocab = pair
    assert teacher.get_output_embeddings().weight.shape[0] == vocab + EXTRA_ROWS
    assert head_weight(teacher, vocab).shape[0] == vocab
    batch = _batch(vocab)
    with torch.no_grad():
        s = student(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits[:, :-1]
        t = teacher(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits[:, :-1]
        with pytest.raises(RuntimeError):
            GKDTrainer.generalized_jsd_loss(s, t, labels=batch["labels"][:, 1:], beta=0.5)
    with pytest.raises(ValueError, match="fewer than the tokenizer's"):
        head_weight(student.get_base_model(), vocab + EXTRA_ROWS)


DDP_CHECK = """
import os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tests.unit import test_chunked_jsd as t

student, teacher, vocab = t.pair.__wrapped__(sys.argv[1])
batch = t._batch(vocab)
want = t._chunked(student, teacher, batch, vocab, 0.5, None).item()
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 1), rank=0, world_size=1)
got = t._chunked(DistributedDataParallel(student), teacher, batch, vocab, 0.5, None)
got.backward()
grads = any(p.grad is not None for n, p in student.named_parameters() if "lora_" in n)
print("RESULT", want, got.item(), grads, flush=True)
os._exit(0)  # gloo's process group can deadlock in its destructor at exit: nothing is left to tear down
"""


def test_the_student_runs_through_ddp_and_peft(tiny_model, tmp_path, repo):
    """A worker's student is DDP-wrapped (its gradient sync hooks in at DDP's forward): the loss goes through the
    wrapper to the hidden state (add_hidden_state_output), and equals the unwrapped student's. In a process of its
    own: a process group in the test session would outlive the test."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", DDP_CHECK, str(tiny_model), str(tmp_path / "store")], cwd=repo,
                       capture_output=True, text=True, timeout=300)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, p.stderr[-2000:]
    want, got, grads = line.split()[1:]
    assert float(got) == pytest.approx(float(want), abs=1e-6) and grads == "True"


def test_gkdtrainer_is_built_on_a_teacher_whose_head_is_longer(pair, tiny_model, tmp_path):
    """TRL 1.16's GKDTrainer.__init__ refuses a teacher whose config's vocab_size differs from the student's (as
    Qwen2.5-7B's does beside 1.5B's); the chunked loss compares only the tokenizer's rows, so the stage builds it
    under heads_cut_for_trl: built, the teacher's config is its own again, and the loss is the cut one. Under ZeRO-3
    (GKD's own loss over the whole heads) the pair is refused with a sentence."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from medgpt_ray.trainer_kit.chunked_jsd import heads_cut_for_trl
    from medgpt_ray.trainer_kit.compose import trainer_class

    student, teacher, vocab = pair
    tok = AutoTokenizer.from_pretrained(tiny_model, local_files_only=True)
    args = GKDConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_length=None, packing=False,
                     dataset_num_proc=None, per_device_train_batch_size=2)
    data = Dataset.from_dict({"messages": [[{"role": "user", "content": "x"}]] * 2})

    def build():
        return trainer_class(GKDTrainer, ChunkedJSD)(model=student, teacher_model=teacher, args=args,
                                                     train_dataset=data, processing_class=tok)

    with pytest.raises(ValueError, match="vocab_size"):
        build()  # TRL's own check, unchanged
    with heads_cut_for_trl(teacher, student, vocab, zero3=False):
        trainer = build()
    assert teacher.config.vocab_size == vocab + EXTRA_ROWS  # restored after the build
    trainer.vocab_size = vocab
    batch = _batch(vocab)
    got = trainer.compute_loss(student, batch)
    assert torch.allclose(got, _reference(student, teacher, batch, vocab, 0.5, None), atol=1e-4)
    with pytest.raises(ValueError, match="under ZeRO-3"), heads_cut_for_trl(teacher, student, vocab, zero3=True):
        pass
    assert teacher.config.vocab_size == vocab + EXTRA_ROWS
