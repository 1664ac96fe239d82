"""Model-family settings (prompts, draft matching), model lookup, and the small models built here
for tests, benchmarks and replay models (`tiny`)."""
