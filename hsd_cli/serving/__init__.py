"""The model runtime: loading, the batching engine, page deadlines, the rows budget."""
