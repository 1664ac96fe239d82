"""The records the stages share: block and status words, the page record, decoding totals."""
