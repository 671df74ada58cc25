"""Generation with trained models, on Ray: batch generation on a Ray Data actor pool (batch.py), an OpenAI-compatible
endpoint on Ray Serve (serve.py), a terminal chat (chat.py), and which model they run (source.py). The model side
of all of them is the Ray-free engine, medgpt_ray/generation/ (docs/ARCHITECTURE.md, "Layout")."""
