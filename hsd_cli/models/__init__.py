"""Model-family settings (prompts, draft matching) and model lookup."""
