"""Memory estimation and the planner that turns a stage config into a StagePlan."""
