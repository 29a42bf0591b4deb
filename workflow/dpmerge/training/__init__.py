"""DP fine-tuning: the step of Eqs. (4)-(7), per-example clipping, the method ablations, the loop."""
