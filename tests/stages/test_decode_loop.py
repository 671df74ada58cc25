"""The static path's own decode loop (generation/decode_loop.py) on the tiny model and CPU: the sequences are
transformers generate's, token for token, greedy and sampled under the same seed (its processors, multinomial's
draw), left padding, several samples a prompt, rows stopping early (the output cut where generate stops; on the CPU,
where the deferred stop flag is read at once, the loop stops at the same step); what it does not cover goes to
generate with the reason; probabilities generate would refuse are refused."""

from __future__ import annotations

import pytest
import torch

from medgpt_ray.generation.decode_path import StaticDecoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tiny_model):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa").eval()
    torch.manual_seed(0)
    with torch.no_grad():  # random matrices: the tiny model's own greedy answer is one token repeated
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return m


def prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of 9, 5 and 7 tokens, left-padded."""
    torch.manual_seed(1)
    ids = torch.randint(5, vocab, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, :4], mask[2, :2] = 0, 0
    return ids.masked_fill(mask == 0, 0), mask


def both(model, ids, mask, **kw) -> tuple[torch.Tensor, torch.Tensor, StaticDecoder]:
    """(the loop's sequences, generate's on its dynamic cache, the decoder), each call seeded alike."""
    decoder = StaticDecoder(ids.shape[1] + kw["max_new_tokens"])
    torch.manual_seed(3)
    with torch.no_grad():
        ours = decoder.generate(model, ids, attention_mask=mask, pad_token_id=0, **kw)
    torch.manual_seed(3)
    with torch.no_grad():
        theirs = model.generate(ids, attention_mask=mask, pad_token_id=0, **kw)
    return ours, theirs, decoder


@pytest.mark.parametrize("sampling", [dict(do_sample=False),
                                      dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.9),
                                      dict(do_sample=True, min_new_tokens=5, repetition_penalty=1.3, min_p=0.05),
                                      dict(do_sample=True, num_return_sequences=2)])
def test_the_loop_decodes_generates_tokens(model, sampling):
    ids, mask = prompts(model.config.vocab_size)
    ours, theirs, decoder = both(model, ids, mask, max_new_tokens=24, **sampling)
    assert decoder.loop == "medgpt"
    assert ours.shape == theirs.shape == (3 * sampling.get("num_return_sequences", 1), 9 + 24)
    assert torch.equal(ours, theirs)
    if sampling["do_sample"]:  # sampled, not the argmax: another seed draws other tokens
        torch.manual_seed(4)
        with torch.no_grad():
            other = decoder.generate(model, ids, attention_mask=mask, pad_token_id=0, max_new_tokens=24, **sampling)
        assert not torch.equal(other, ours)


def test_rows_that_stop_are_padded_and_the_loop_stops_soon_after_the_last(model):
    ids, mask = prompts(model.config.vocab_size)
    with torch.no_grad():
        free = model.generate(ids, attention_mask=mask, max_new_tokens=60, do_sample=False, pad_token_id=0)[:, 9:]
    stops = [int(free[0, 3]), int(free[1, 6]), int(free[2, 1])]  # each row stops by its 7th token at the latest
    forwards = []
    hook = model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        ours, theirs, decoder = both(model, ids, mask, max_new_tokens=60, do_sample=False, eos_token_id=stops)
    finally:
        hook.remove()
    assert decoder.loop == "medgpt" and torch.equal(ours, theirs)
    new = ours[:, 9:]
    assert new.shape[1] <= 7 and bool((new == 0).any())  # cut where generate stopped; a row padded after its stop
    ours_forwards = len(forwards) - new.shape[1]  # generate's: one a token
    assert ours_forwards == new.shape[1]  # stopped with the last row, not at max_new_tokens (60)


def test_generates_output_object_when_asked_for_it(model):
    """GKD's student samples ask for return_dict_in_generate and read `.sequences`."""
    ids, mask = prompts(model.config.vocab_size)
    ours, theirs, decoder = both(model, ids, mask, max_new_tokens=8, do_sample=True, return_dict_in_generate=True)
    assert decoder.loop == "medgpt" and type(ours) is type(theirs)
    assert torch.equal(ours.sequences, theirs.sequences)


@pytest.mark.parametrize(("extra", "why"), [
    (dict(num_beams=2), "generation mode beam_search"),
    (dict(no_repeat_ngram_size=2), "logits processors ['NoRepeatNGramLogitsProcessor']"),
    (dict(return_dict_in_generate=True, output_scores=True), "outputs beyond the sequences, or stopping beyond stop "
                                                             "tokens"),
])
def test_what_the_loop_does_not_cover_goes_to_generate_with_the_reason(model, extra, why):
    ids, mask = prompts(model.config.vocab_size)
    decoder = StaticDecoder(64)
    with torch.no_grad():
        decoder.generate(model, ids, attention_mask=mask, pad_token_id=0, max_new_tokens=4, **extra)
    assert decoder.loop == f"generate ({why})"


def streamed(model, tokenizer, decoder, ids, mask, **kw) -> tuple[torch.Tensor, str]:
    """(the sequences, the text a TextIteratorStreamer got) of one call, `decoder`'s or (None) generate's."""
    from transformers import TextIteratorStreamer

    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    torch.manual_seed(5)
    with torch.no_grad():
        if decoder is None:
            out = model.generate(ids, attention_mask=mask, pad_token_id=0, streamer=streamer, **kw)
        else:
            out = decoder.generate(model, ids, attention_mask=mask, pad_token_id=0, streamer=streamer, **kw)
    return out, "".join(streamer)


class StopAfter:
    """A host-only stopping criterion (as chat's cancel and deadline are): every row stops at its `n`-th call."""

    host_only = True

    def __init__(self, n: int):
        self.n, self.calls = n, 0

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        return torch.full((input_ids.shape[0],), self.calls >= self.n, dtype=torch.bool, device=input_ids.device)


def test_a_streamer_and_a_host_only_criterion_as_chat_passes_them(model, tiny_model):
    """Chat's call (generation/stream.py): a batch of one, a TextIteratorStreamer, a cancel-or-deadline criterion.
    The loop streams the text generate streams and stops where the criterion fires, as generate does."""
    from transformers import AutoTokenizer, StoppingCriteriaList

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids, mask = prompts(model.config.vocab_size)
    one, one_mask = ids[:1], mask[:1]
    decoder = StaticDecoder(9 + 20)
    for kw in (dict(do_sample=True), dict(do_sample=False)):
        ours = streamed(model, tokenizer, decoder, one, one_mask, max_new_tokens=20, **kw)
        assert decoder.loop == "medgpt"
        theirs = streamed(model, tokenizer, None, one, one_mask, max_new_tokens=20, **kw)
        assert torch.equal(ours[0], theirs[0]) and ours[1] == theirs[1] and ours[1]
    cut = {}
    for who in ("ours", "theirs"):
        stop = StoppingCriteriaList([StopAfter(6)])
        cut[who] = streamed(model, tokenizer, decoder if who == "ours" else None, one, one_mask, max_new_tokens=20,
                            do_sample=False, stopping_criteria=stop)
    assert decoder.loop == "medgpt" and cut["ours"][0].shape[1] == 9 + 6
    assert torch.equal(cut["ours"][0], cut["theirs"][0]) and cut["ours"][1] == cut["theirs"][1]


def test_a_streamer_of_several_rows_and_a_criterion_that_may_read_the_gpu_go_to_generate(model, tiny_model):
    from transformers import AutoTokenizer, MaxLengthCriteria, StoppingCriteriaList, TextIteratorStreamer

    ids, mask = prompts(model.config.vocab_size)
    decoder = StaticDecoder(64)
    with torch.no_grad():
        decoder.generate(model, ids, attention_mask=mask, pad_token_id=0, max_new_tokens=4,
                         stopping_criteria=StoppingCriteriaList([MaxLengthCriteria(12)]))
    assert decoder.loop == "generate (stopping criteria that may read the GPU)"
    streamer = TextIteratorStreamer(AutoTokenizer.from_pretrained(tiny_model))
    with pytest.raises(ValueError, match="batch size 1"), torch.no_grad():  # generate's own refusal
        decoder.generate(model, ids, attention_mask=mask, pad_token_id=0, max_new_tokens=4, streamer=streamer)
    assert decoder.loop == "generate (a streamer of more than one row)"


def test_probabilities_generate_would_refuse_are_refused(model):
    ids, mask = prompts(model.config.vocab_size)
    head = model.get_output_embeddings().weight
    saved = head.detach().clone()
    with torch.no_grad():
        head[5].fill_(float("nan"))
    try:
        with pytest.raises(RuntimeError, match="probability tensor contains"):
            both(model, ids, mask, max_new_tokens=4, do_sample=True)
    finally:
        with torch.no_grad():
            head.copy_(saved)
