"""The generation engine, Ray-free (docs/ARCHITECTURE.md, "Layout"): a trained model loaded for generation, prompts
rendered with the chat template it was trained with, batches decoded up to each answer's stop token, or one answer
streamed as it grows. It runs in any process; infer/ puts it on Ray (a Ray Data actor pool, Ray Serve replicas) and
the stage kinds call it in their own process (the eval stage).

- params.py    GenerationParams: how many tokens, greedy or sampled, how many samples, the seed
- prompts.py   rendering a conversation as the model's prompt; the token ids where an answer ends
- loading.py   the model and tokenizer for generation (the GPU's when there is one, else the CPU)
- engine.py    Generator: a batch of prompts in, one row per sample out
- stream.py    StreamedAnswer: one answer generated in a thread, read piece by piece (chat, serving)
- session.py   DecodeSession: a conversation's answers on one thread and its decode path (chat: one static cache
               for the conversation on a GPU)
- decode_path.py the decode path (dynamic, or static: one static cache per run, the decode step compiled by
               transformers with CUDA graphs) chosen with its reason; StaticDecoder
- packed_gqa.py the static decode step's attention without repeat_kv's copies (one-token queries folded onto their
               KV heads), switched on for a StaticDecoder's generate call
- sampler.py   Sampler: the one sampler both loops draw with (generate's sampling, each row its own settings and
               seed)
- decode_loop.py the batch loop, the static path's: transformers' generate settings and compiled decode step, without
               its host waits on the GPU every token (a call it does not cover runs in generate)
- deferred.py  what that loop learns from the GPU (every row stopped, a streamer's tokens) read once it is written
- slot_engine.py SlotEngine (`serve --engine slots`): continuous batching on a static cache's rows (slot_cache.py),
               each step the one compiled decode step, each request's own sampling (sampler.py): the continuous loop
- continuous.py ContinuousEngine: continuous batching across concurrent requests (transformers' own engine, its page
               pool sized from the server's limits), streamed, cancelled on a deadline or a reader gone
"""
