"""The opd kind (kinds/opd/): its config keys and checks, its place in the stage graph (a stage teacher is a `needs`),
its memory plan (the teacher's weights, forward and loss, the student's generation) and its fingerprint (the
teacher's identity)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from medgpt_ray.config import ConfigError, PipelineConfig
from medgpt_ray.kinds.opd.config import OPDStageConfig
from medgpt_ray.memory import generation
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.estimator import NF4_BYTES_PER_PARAM, TrainSetup, estimate
from medgpt_ray.memory.planner import PlanError, plan_stage
from medgpt_ray.memory.profiles import setup_fields
from medgpt_ray.memory.shapes import PRESETS, load_shape
from medgpt_ray.run import dag

PROV = {"git_commit": "abc", "packages": {"trl": "1.16.0"}}


def make(**opd) -> PipelineConfig:
    return PipelineConfig.model_validate({"model": {"path": "tiny"}, "stages": {"opd": {"enabled": True, **opd}}})


def write_teacher(path, shape_name: str = "qwen2.5-1.5b", **changes) -> str:
    """A teacher directory with only a config.json (what planning and the fingerprint read), of a preset's shape."""
    s = PRESETS[shape_name]
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "qwen2", "vocab_size": s.vocab, "hidden_size": s.hidden, "intermediate_size": s.intermediate,
           "num_hidden_layers": s.layers, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
           "tie_word_embeddings": s.tied_embeddings, **changes}
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def test_opd_is_off_by_default_with_medicalgpt_defaults_and_starts_from_the_base_model():
    cfg = PipelineConfig.model_validate({"model": {"path": "tiny"}})
    c = cfg.stages.get("opd")
    assert isinstance(c, OPDStageConfig) and not c.enabled and "opd" not in cfg.enabled_stages()
    assert (c.lmbda, c.beta, c.teacher, c.teacher_quantization) == (0.5, 0.5, "sft", "none")
    assert make().start_of("opd") is None  # the student: the base model, unless `from` names a stage
    assert make(**{"from": "pt"}).start_of("opd") == "pt"


def test_a_stage_teacher_is_a_dependency_and_a_directory_teacher_is_not(tmp_path):
    cfg = make(teacher="sft")
    assert cfg.stages.get("opd").needs == ["sft"]
    assert dag.dependencies(cfg, "opd") == ["sft"]
    assert dag.waves(cfg, cfg.enabled_stages()) == [["pt"], ["sft"], ["rm", "dpo", "opd"]]
    assert "opd" in dag.downstream(cfg, "sft", cfg.enabled_stages())  # a rerun teacher reruns the student
    teacher = write_teacher(tmp_path / "teacher")
    direct = make(teacher=teacher)
    assert direct.stages.get("opd").needs == [] and dag.dependencies(direct, "opd") == []
    assert direct.stages.get("opd").teacher_path({}) == teacher


@pytest.mark.parametrize("opd, message", [
    ({"teacher": "stf"}, "teacher: 'stf' is neither a stage"),
    ({"teacher": "sft", "from": "sft"}, "the student would start as the teacher"),
    ({"max_new_tokens": 1024, "seq_len": 1024}, "max_new_tokens: 1024 leaves no room"),
    ({"lmbda": 1.5}, "lmbda"),
    ({"beta": -0.1}, "beta"),
    ({"teacher_quantization": "8bit"}, "teacher_quantization"),
])
def test_bad_opd_settings_are_refused(opd, message):
    with pytest.raises(ValueError, match=message):
        make(**opd)


def test_a_disabled_teacher_stage_is_refused():
    with pytest.raises(ValueError, match=r"stages.opd.needs: stage 'sft' is disabled"):
        PipelineConfig.model_validate({"model": {"path": "tiny"},
                                       "stages": {"opd": {"enabled": True}, "sft": {"enabled": False}}})


def test_the_plan_holds_the_teacher_and_the_students_generation():
    c = make(seq_len=256, max_new_tokens=32).stages.get("opd")
    plan = plan_stage("opd", c, 1, False)
    b = plan.prediction.breakdown_gib
    assert {"teacher_weights", "teacher_hidden", "distillation_loss"} <= set(b)
    assert plan.steps_per_generation == 1  # GKD generates in every on-policy micro-batch
    # The student's generation is planned (memory/generation.py's phase, one answer per prompt): its decode steps
    # are priced, and its KV cache and sampling logits are a phase beside training, the teacher resident in both; with
    # GKD's full-vocabulary loss the training phase is the larger.
    gpu = make_budget(80.0, 0.0, "auto", True, "none")
    shape = load_shape("qwen2.5-7b")

    def planned(max_new_tokens: int):
        c7 = make(seq_len=1024, max_new_tokens=max_new_tokens, micro_batch=2, grad_ckpt=True,
                  method="lora").stages.get("opd")
        return plan_stage("opd", c7, 1, True, shape, gpu).prediction

    short, long = planned(16), planned(768)
    assert long.tokens_per_s_per_gpu < 0.5 * short.tokens_per_s_per_gpu
    s = replace(TrainSetup(stage="opd", method="lora", precision="bf16", micro_batch=2, seq_len=1024),
                **setup_fields("opd", make(seq_len=1024, max_new_tokens=768, generation_path="dynamic")
                               .stages.get("opd"), True))  # the static path also holds its cache in training
    training = estimate(shape, replace(s, generations=0))
    assert generation.peak(shape, s).peak_bytes == training.peak_bytes  # GKD's full-vocabulary loss is the peak
    assert training.breakdown["teacher_weights"] == pytest.approx(2 * shape.params)
    no_teacher = estimate(shape, replace(s, generations=0, kind_terms=None))
    own = sum(v for k, v in training.breakdown.items() if k.startswith("teacher_") or k == "distillation_loss")
    assert training.peak_bytes == pytest.approx(no_teacher.peak_bytes + own)


def test_the_teacher_is_planned_at_its_own_shape_and_precision(tmp_path):
    gpu = make_budget(80.0, 0.0, "auto", True, "none")
    shape = load_shape("qwen2.5-1.5b")

    def teacher_gib(**opd) -> float:
        c = make(seq_len=512, max_new_tokens=64, method="lora", micro_batch=1, **opd).stages.get("opd")
        return plan_stage("opd", c, 1, True, shape, gpu).prediction.breakdown_gib["teacher_weights"]

    same = teacher_gib()  # the sft stage: the run's base shape, bf16
    assert same == pytest.approx(2 * shape.params / 2**30, rel=1e-3)
    bigger = teacher_gib(teacher=write_teacher(tmp_path / "t7", "qwen2.5-7b"))
    assert bigger == pytest.approx(2 * load_shape("qwen2.5-7b").params / 2**30, rel=1e-3)
    t7 = load_shape(str(tmp_path / "t7"))  # NF4 linear layers (QLoRA's loader), embeddings and head in bf16
    nf4 = NF4_BYTES_PER_PARAM * t7.linear_params + 2 * (t7.params - t7.linear_params)
    assert teacher_gib(teacher=str(tmp_path / "t7"), teacher_quantization="4bit") == pytest.approx(nf4 / 2**30,
                                                                                                  rel=1e-3)


def test_the_chunked_loss_lets_a_24gib_card_take_micro_batch_4_and_a_refusal_names_opds_own_options():
    """GKD's full-vocabulary loss held ~12 GiB a 1,024-token sequence (micro-batch 2 died at 23.3 GiB on a 24 GiB
    cap, bench/results/opd_memory_1.5b_h200_uncalibrated.json); the chunked divergence holds two fp32 tiles and the
    answer tokens' hidden states, so micro-batch 4 of a 1.5B student and teacher fits a 24 GiB card. A micro-batch
    that does not fit is refused with opd's own keys among the options."""
    from medgpt_ray.kinds.opd.memory import TOKEN_TILE, VOCAB_TILE

    rtx4090 = make_budget(24.0, 2.0, "rtx4090", True, "t")
    shape = load_shape("qwen2.5-1.5b")
    c = make(seq_len=1024, max_new_tokens=256, method="lora", micro_batch=4).stages.get("opd")
    four = plan_stage("opd", c, 1, True, shape, rtx4090)
    assert four.micro_batch == 4 and four.prediction.peak_gib <= 22.0
    tiles = 2 * 4 * min(4 * 1024, TOKEN_TILE) * VOCAB_TILE / 2**30
    assert tiles <= four.prediction.breakdown_gib["distillation_loss"] <= tiles + 0.2  # not 4 x 12 GiB
    with pytest.raises(PlanError) as err:
        plan_stage("opd", c.model_copy(update={"micro_batch": 16, "seq_len": 4096}), 1, True, shape, rtx4090)
    msg = str(err.value)
    assert "other options at micro-batch 1 with full checkpointing: micro_batch 1: " in msg
    assert "max_new_tokens 128: " in msg and "teacher_quantization 4bit: " in msg
    assert "max_completion_length" not in msg  # grpo's key, not opd's


def test_the_tiles_are_trls():
    """The terms above price TRL's ChunkedDivergenceFunction's tiles: an upgrade that changes them fails here."""
    from trl.kernels import chunked_divergence

    from medgpt_ray.kinds.opd.memory import TOKEN_TILE, VOCAB_TILE

    assert (TOKEN_TILE, VOCAB_TILE) == (chunked_divergence.TOKEN_CHUNK_SIZE, chunked_divergence.VOCAB_CHUNK_SIZE)


def test_a_4bit_teacher_is_refused_on_cpu():
    with pytest.raises(ConfigError, match="teacher_quantization: '4bit' needs GPUs"):
        plan_stage("opd", make(teacher_quantization="4bit").stages.get("opd"), 1, False)


def _fingerprint(cfg: PipelineConfig, needs_fps: dict[str, str] | None = None) -> str:
    plan = plan_stage("opd", cfg.stages.get("opd"), 1, False)
    return dag.fingerprint(cfg, "opd", plan, "data", None, {"model_type": "qwen2"}, PROV, needs_fps)


def test_the_teachers_identity_is_in_the_fingerprint(tmp_path):
    teacher = write_teacher(tmp_path / "teacher")
    first = _fingerprint(make(teacher=teacher))
    assert _fingerprint(make(teacher=teacher)) == first
    write_teacher(tmp_path / "teacher", num_hidden_layers=40)  # the same path, another model
    assert _fingerprint(make(teacher=teacher)) != first
    other = write_teacher(tmp_path / "other")  # the same config.json at another path
    assert _fingerprint(make(teacher=other)) not in (first, _fingerprint(make(teacher=teacher)))
    # A stage teacher: its fingerprint enters as a `needs` (run/pipeline.py passes every needs' fingerprint).
    staged = make(teacher="sft")
    assert _fingerprint(staged, {"sft": "f1"}) != _fingerprint(staged, {"sft": "f2"})
    assert _fingerprint(make(teacher="sft", teacher_quantization="none", lmbda=0.9), {"sft": "f1"}) != \
        _fingerprint(staged, {"sft": "f1"})


def test_a_conversation_is_its_prompt_and_last_answer_left_padded(tiny_model):
    from medgpt_ray import models, templates
    from medgpt_ray.kinds.opd.data import PromptAnswerCollator, encode_prompt_answer

    tok = models.load_tokenizer(tiny_model)
    chatml = templates.get_template("chatml")
    talk = [{"role": "user", "content": "头痛三天"}, {"role": "assistant", "content": "多久了？"},
            {"role": "user", "content": "三天"}, {"role": "assistant", "content": "神经科"}]
    long_prompt = [{"role": "user", "content": "头痛" * 200}, {"role": "assistant", "content": "神经科"}]
    records = [{"conversations": talk}, {"conversations": long_prompt}]
    rows, skipped = encode_prompt_answer(records, tok, chatml, seq_len=128, max_new_tokens=16, policy="skip")
    assert len(rows) == 1 and (skipped["prompt_too_long"], skipped["tools_unsupported"]) == (1, 0)
    # truncate (the default): the long prompt keeps its end, so the student's max_new_tokens still fit
    cut, counted = encode_prompt_answer(records, tok, chatml, seq_len=128, max_new_tokens=16)
    assert len(cut) == 2 and counted["overlong"].truncated == 1 and cut[1]["prompt_len"] == 128 - 16
    assert tok.decode(cut[1]["input_ids"][cut[1]["prompt_len"]:]) == "神经科<|im_end|>"
    row = rows[0]
    prompt, answer = row["input_ids"][:row["prompt_len"]], row["input_ids"][row["prompt_len"]:]
    assert tok.decode(answer) == "神经科<|im_end|>"  # the last answer through its end of turn, not the separator
    assert tok.decode(prompt).endswith("三天<|im_end|>\n<|im_start|>assistant\n") and "多久了" in tok.decode(prompt)
    short = {"input_ids": prompt[-3:] + answer, "prompt_len": 3}
    batch = PromptAnswerCollator(tok.pad_token_id)([row, short])
    width = len(row["input_ids"])
    assert batch["input_ids"].shape == batch["labels"].shape == (2, width)
    assert batch["attention_mask"][1].tolist() == [0] * (width - len(short["input_ids"])) + [1] * len(
        short["input_ids"])
    assert batch["labels"][0].tolist() == [-100] * row["prompt_len"] + answer  # trained on the answer only
    assert batch["prompts"].shape == (2, row["prompt_len"]) and batch["prompts"][0].tolist() == prompt
    assert batch["prompt_attention_mask"][1].tolist() == [0] * (row["prompt_len"] - 3) + [1] * 3


def test_the_stage_refuses_a_4bit_teacher_without_a_gpu(tiny_model, tmp_path):
    from medgpt_ray.kinds.opd.stage import load_teacher
    from medgpt_ray.stages.inputs import StageInputs

    plan = plan_stage("opd", make(teacher=str(tiny_model)).stages.get("opd"), 1, False)
    c = make(teacher=str(tiny_model), teacher_quantization="4bit").stages.get("opd")
    inp = StageInputs("opd", c, plan, str(tiny_model), "chatml", "train", "eval", str(tmp_path))
    with pytest.raises(ValueError, match="teacher_quantization '4bit' needs a CUDA GPU"):
        load_teacher(inp)
    missing = make(teacher=str(tmp_path / "nothing")).stages.get("opd")
    with pytest.raises(ValueError, match="is not a model directory here"):
        load_teacher(StageInputs("opd", missing, plan, str(tiny_model), "chatml", "t", "e", str(tmp_path)))


def test_a_teacher_directory_must_tokenize_as_the_student(tiny_model, tmp_path):
    """Checked before Ray starts (run/preflight.check_teachers), naming the key and both directories: a teacher
    with the student's tokenizer passes; one with a token added, or one id moved, is refused with what differs."""
    import shutil

    from transformers import AutoTokenizer

    from medgpt_ray.run.preflight import check_teachers

    same = tmp_path / "same"
    shutil.copytree(tiny_model, same)
    check_teachers(make(teacher=str(same)))
    grown = tmp_path / "grown"
    shutil.copytree(tiny_model, grown)
    tok = AutoTokenizer.from_pretrained(grown, local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": ["<|teacher_only|>"]})
    tok.save_pretrained(grown)
    with pytest.raises(ConfigError, match=rf"stages\.opd\.teacher: {re.escape(str(grown))} does not share the "
                                          rf"student's tokenizer \({re.escape(str(tiny_model))}\): 3,000 tokens in "):
        check_teachers(make(teacher=str(grown)))
    (tmp_path / "bare").mkdir()
    with pytest.raises(ConfigError, match="stages.opd.teacher: .*bare is not a model directory"):
        check_teachers(make(teacher=str(tmp_path / "bare")))
    check_teachers(make())  # the run's own sft stage: nothing to compare


def test_under_zero3_the_plan_prices_gkds_own_loss():
    """ZeRO-3 partitions both heads, so the stage keeps GKDTrainer's full-logit loss there (trainer_kit/chunked_jsd.py)
    and the plan prices it as measured; elsewhere the chunked divergence's tiles."""
    from medgpt_ray.kinds.opd.memory import JSD_ELEMENTS_PER_LOGIT

    shape = load_shape("qwen2.5-1.5b")
    s = replace(TrainSetup(stage="opd", method="full", precision="bf16", micro_batch=2, seq_len=1024),
                **setup_fields("opd", make(seq_len=1024, max_new_tokens=128).stages.get("opd"), True))
    chunked, zero3 = s.kind_terms(shape, s).training, s.kind_terms(shape, replace(s, zero=3)).training
    assert "teacher_hidden" in chunked and "teacher_logits" not in chunked
    assert zero3["teacher_logits"] == pytest.approx(2 * s.tokens() * shape.vocab)
    assert zero3["distillation_loss"] == pytest.approx(JSD_ELEMENTS_PER_LOGIT * 2 * s.tokens() * shape.vocab)
    assert zero3["distillation_loss"] > 5 * chunked["distillation_loss"]


def test_the_teachers_forward_and_the_divergence_are_not_summed(tmp_path):
    """The teacher's no-grad forward ends before the chunked divergence starts: the plan holds the larger of the two
    working sets, not both. At 4 x 1,024 tokens a 1.5B teacher's forward is smaller than the divergence's tiles
    (nothing added for it); a 7B teacher's at 16 x 1,024 is larger (only the excess added). The sum was 2-3 GiB over
    the H100's peaks (bench/results/opd_peaks_h100/)."""
    from medgpt_ray.kinds.opd.memory import teacher_terms

    student = load_shape("qwen2.5-1.5b")
    s = TrainSetup(stage="opd", method="lora", precision="bf16", micro_batch=4, seq_len=1024)
    small = teacher_terms(None, "none", student, s).training
    assert small["teacher_forward"] == 0
    t7 = load_shape(write_teacher(tmp_path / "t7", "qwen2.5-7b"))
    s = replace(s, micro_batch=16)
    big = teacher_terms(t7, "4bit", student, s).training
    forward = 2 * s.tokens() * (4 * t7.hidden + 3 * t7.mlp_width)
    assert 0 < big["teacher_forward"] < forward
    assert big["teacher_forward"] + big["distillation_loss"] == pytest.approx(forward)
