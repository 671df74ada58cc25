"""The two model-free baselines for held-out preference accuracy (data/preference_baselines.py), and the shipped
sample pairs judged by them: split as the default pipeline splits them, neither the answers' length nor their
wording tells the chosen from the rejected one."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from medgpt_ray.config import load_config
from medgpt_ray.data.preference_baselines import (
    BigramPerceptron,
    baselines,
    length_accuracy,
    length_rule,
    preference_baselines,
)
from medgpt_ray.data.prepare import prepare_kind
from tests.unit.test_readers import ROOT, SAMPLE
from tests.unit.test_sample_corpora import load_make_sample, reward_rows


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> dict:
    """The default demo's preference files, prepared with its eval_fraction: exactly the pipeline's split."""
    cfg = load_config(ROOT / "configs" / "tiny-cpu.yaml")
    paths = [str(ROOT / p) for p in cfg.data.preference]
    d = prepare_kind("preference", paths, tmp_path_factory.mktemp("pref"), cfg.data.eval_fraction,
                     cfg.data.max_records, cfg.data.pii_types())
    return preference_baselines(d.train_file, d.eval_file) | {"prepared": d}


def test_shipped_pairs_give_nothing_away_to_length_or_wording(shipped: dict) -> None:
    assert shipped["eval_pairs"] == shipped["prepared"].eval_records >= 200
    assert 0.4 <= shipped["eval_chosen_longer"] <= 0.6
    assert 0.4 <= shipped["length"]["accuracy"] <= 0.6
    # It fits its own train pairs better than chance (it is not broken), yet that carries over to nothing.
    assert shipped["bigram_perceptron"]["train_accuracy"] > 0.55
    assert shipped["bigram_perceptron"]["accuracy"] <= 0.65


def test_every_sample_answer_is_chosen_as_often_as_rejected() -> None:
    """Each rule's two answers (a drug, a department, an action) are each chosen in exactly half of the pairs
    that offer them, and in every pair the other answer of the same rule is the rejected one."""
    rules = load_make_sample().PAIR_RULES
    rows = reward_rows()
    chosen: Counter = Counter()
    rejected: Counter = Counter()

    for row in rows:
        # The rule whose answer i is the chosen text and whose other answer the rejected one: exactly one rule
        # offers both (a drug may appear in two rules, its counterpart never).
        fits = [(rule.name, i) for rule in rules for i in (0, 1)
                if any(p in row["response_chosen"] for p in rule.answers[i])
                and any(p in row["response_rejected"] for p in rule.answers[1 - i])]
        assert len(fits) == 1, row
        name, i = fits[0]
        chosen[name, i] += 1
        rejected[name, 1 - i] += 1
    assert len(chosen) == 2 * len(rules) >= 20
    assert chosen == rejected
    assert len(rows) == sum(chosen.values())


def test_shipped_pair_shapes() -> None:
    rows = reward_rows()
    longer = sum(len(r["response_chosen"]) > len(r["response_rejected"]) for r in rows)
    assert longer * 2 == len(rows)  # by construction: the chosen answer is the longer one in exactly half
    assert all(len(r["response_chosen"]) != len(r["response_rejected"]) for r in rows)
    assert (SAMPLE / "reward.jsonl").stat().st_size < 1_000_000


def synthetic_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """Pairs that an answer alone does decide: the chosen answer sends the patient to a doctor, the rejected one
    tells them to double the dose, around the same filler, and the chosen one is the longer in half of them."""
    r = random.Random(seed)
    good = ["请尽快到医院就诊。", "建议找医生面诊检查。", "请遵医嘱规律用药。"]
    bad = ["自己加倍吃药就行。", "把药停了也没关系。", "随便买点抗生素吃。"]
    filler = ["平时多喝水。", "注意休息。", "饮食清淡一些。", "保持好心情。", "多观察几天。"]
    pairs = []
    while len(pairs) < n:
        c = r.choice(good) + "".join(r.sample(filler, r.randint(0, 3)))
        j = r.choice(bad) + "".join(r.sample(filler, r.randint(0, 3)))
        if len(c) != len(j) and (len(c) > len(j)) == (len(pairs) % 2 == 0):
            pairs.append((c, j))
    return pairs


def test_the_perceptron_learns_what_an_answer_alone_gives_away() -> None:
    result = baselines(synthetic_pairs(400, 1), synthetic_pairs(200, 2))
    assert result["bigram_perceptron"]["accuracy"] >= 0.9
    assert 0.4 <= result["length"]["accuracy"] <= 0.6


def test_length_rule_is_fitted_on_train_and_ties_count_half() -> None:
    shorter_wins = [("短", "长一些"), ("短句", "更长的句子")]
    assert length_rule(shorter_wins) == ("shorter", 1.0)
    assert length_rule([("长一些", "短")]) == ("longer", 1.0)
    assert length_accuracy([("一样", "同样"), ("长一些", "短")], "longer") == 0.75
    assert length_accuracy([("长一些", "短")], "shorter") == 0.0


def test_perceptron_ties_count_half_and_fitting_is_deterministic() -> None:
    untrained = BigramPerceptron()
    assert untrained.accuracy([("甲乙", "丙丁")]) == 0.5  # every score 0: a tie
    train = synthetic_pairs(100, 3)
    assert BigramPerceptron().fit(train).weights == BigramPerceptron().fit(train).weights


def test_no_held_out_pairs_have_no_accuracy() -> None:
    result = baselines(synthetic_pairs(10, 4), [])
    assert result["eval_pairs"] == 0 and result["eval_chosen_longer"] is None
    assert result["length"]["accuracy"] is None and result["bigram_perceptron"]["accuracy"] is None


def test_baselines_read_the_prepared_split_files(tmp_path: Path) -> None:
    d = prepare_kind("preference", [str(SAMPLE / "formats" / "preference_sharegpt.jsonl")], tmp_path, 0.3)
    result = preference_baselines(d.train_file, d.eval_file)
    assert (result["train_pairs"], result["eval_pairs"]) == (d.train_records, d.eval_records)
    # MedicalGPT's own format sample is easy on purpose: its chosen answers are the longer, specific ones.
    assert result["length"]["rule"] == "longer" and result["length"]["train_accuracy"] >= 0.9
