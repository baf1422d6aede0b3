"""The planner's refusal."""


class PlanError(ValueError):
    """A recipe or setting the planner cannot assess (unsupported model, missing rates);
    the message says what and why."""
