"""Stage kinds, one folder a kind (docs/ARCHITECTURE.md, "The stage-kind contract"): each folder's config.py sits
with config/, memory.py with memory/, stage.py with the Ray-free trainer code; kinds/base.py holds the registry."""
