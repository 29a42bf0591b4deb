"""Data-free merging: tensor sources, streamed order statistics and the operators (pure tensor code: no data,
no privacy)."""
