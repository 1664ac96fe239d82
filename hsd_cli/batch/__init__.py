"""A run over many documents: discovery, tasks, workers and executors, resume, exit codes."""
