"""A stage encodes its data while its model loads (stages/stage_data.StageData.encoded_while, issue 48): the two
run at once, the encoding gives what it gives alone, and a load that fails is the stage's error."""

from __future__ import annotations

import threading

import pytest

from medgpt_ray.stages.conversation_rows import encode_conversations
from medgpt_ray.stages.stage_data import StageData


def conversation(i: int) -> dict:
    return {"conversations": [{"role": "user", "content": f"第{i}位患者头痛三天，需要做什么检查？"},
                              {"role": "assistant", "content": f"建议先测血压，记录头痛的时间和部位（{i}）。"}]}


@pytest.fixture(scope="module")
def data(tiny_model) -> StageData:
    from medgpt_ray import models, templates

    return StageData(models.load_tokenizer(tiny_model), templates.get_template("chatml"),
                     [conversation(i) for i in range(40)], {"shard": 0, "shards": 1},
                     [conversation(i) for i in range(40, 44)])


def test_the_encoding_runs_while_the_model_loads_and_gives_what_it_gives_alone(data):
    encoding = threading.Event()
    threads: list[str] = []

    def encode(records, tokenizer, template, *args):
        threads.append(threading.current_thread().name)
        encoding.set()
        return encode_conversations(records, tokenizer, template, *args)

    def load() -> str:
        # Sequential code would encode before or after this: either way the event would not be set in time.
        assert encoding.wait(timeout=30), "the encoding did not start while the model loaded"
        return "model"

    model, (train, skipped, held_out) = data.encoded_while(load, encode, 256)
    assert model == "model"
    assert all(name.startswith("encode") for name in threads) and len(threads) == 2  # train, then held-out split
    alone_train, alone_skipped, alone_held_out = data.encoded(encode_conversations, 256)
    assert train["input_ids"] == alone_train["input_ids"] and train["labels"] == alone_train["labels"]
    assert held_out["input_ids"] == alone_held_out["input_ids"]
    assert skipped["too_long"] == alone_skipped["too_long"] == 0


def test_a_failed_load_is_the_error_and_a_failed_encoding_after_a_good_load_is_too(data):
    def load_fails():
        raise MemoryError("CUDA out of memory while loading")

    with pytest.raises(MemoryError, match="while loading"):
        data.encoded_while(load_fails, encode_conversations, 256)
    # seq_len 4 leaves no conversation trainable: the encoding's own error, raised here, after the load
    with pytest.raises(ValueError, match="none of the 40 conversations can be trained"):
        data.encoded_while(lambda: "model", encode_conversations, 4)
