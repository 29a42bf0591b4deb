"""Data-free merging: tensor sources, streamed order statistics, the operators, private merge statistics."""
