"""Generation with trained models: batch generation on a Ray Data actor pool (batch.py); the eval stage, chat and
serving build on it."""
