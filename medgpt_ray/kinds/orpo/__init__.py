"""The orpo stage kind (docs/ARCHITECTURE.md, "The stage-kind contract")."""
