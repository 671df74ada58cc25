"""Stage kinds, one folder a kind (docs/ARCHITECTURE.md, "The stage-kind contract"): each folder's config.py sits
with config/, memory.py with memory/, stage.py with the Ray-free trainer code; the registry is config/registry.py."""

# The config package first, whatever kinds/ module is imported first: it imports every kind's config.py in pipeline
# order (the registry's order); importing one kind's config.py before it would register that kind out of order.
import medgpt_ray.config  # noqa: E402, F401
