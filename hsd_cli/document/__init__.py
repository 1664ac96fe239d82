"""A document's way through the stages: their order, page checkpoints, drafts made ahead, writing."""
