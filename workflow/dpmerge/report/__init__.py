"""What a reader sees: the paper's tables, figures and their labels."""
