"""Privacy: noise calibration and accounting, the study's secret key, keyed randomness, the ledger."""
