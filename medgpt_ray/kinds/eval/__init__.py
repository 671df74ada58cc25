"""The eval stage kind (docs/ARCHITECTURE.md, "The stage-kind contract"): config.py (its config class and registry
entry), stage.py (the models compared on the held-out split), scores.py (loss, reward and exam scores on a loaded
model), stats.py (win rates and their bootstrap interval)."""
