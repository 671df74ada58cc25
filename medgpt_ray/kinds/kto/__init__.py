"""The kto stage kind (docs/ARCHITECTURE.md, "The stage-kind contract")."""
