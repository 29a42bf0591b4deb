"""Privacy records as the stages write them, for tests of the ledger and its checks: a release's record
calibrated for real, and a ledger of such records."""

from dpmerge.privacy.accounting import calibrate_noise_multiplier, effective_noise_multiplier, spent_epsilon


def release(task, epsilon=4.0, method="dp_merging", rho=0.05, seed=0, backbone="b", **overrides):
    """A release's privacy record as finetune() writes it, calibrated for real (q = 0.05, 40 steps)."""
    from dpmerge.methods import METHODS

    queries = METHODS[method].queries_per_step
    q, steps, delta = 0.05, 40, 1e-3
    private = METHODS[method].private
    accountant, relation = overrides.pop("accountant", "pld"), overrides.pop("neighbouring", "replace_one")
    sigma = calibrate_noise_multiplier(epsilon, delta, q, steps, queries, accountant, relation) if private else 0.0
    record = {"task": task, "backbone": backbone, "method": method, "target_epsilon": epsilon if private else "inf",
              "spent_epsilon": spent_epsilon(sigma, q, steps, delta, queries, accountant, relation) if private
              else "inf",
              "delta": delta if private else 0.0, "noise_multiplier": sigma,
              "effective_noise_multiplier": effective_noise_multiplier(sigma, queries), "sample_rate": q,
              "steps": steps, "clip_norm": 0.2, "queries_per_step": queries, "steps_by_queries": {str(queries): steps},
              "accountant": accountant if private else None, "sampling": "poisson", "neighbouring": relation,
              "randomness": "keyed", "seed": seed, "rho": rho, "anchor_lambda": 0.05, "pretrained_sha256": "w0",
              # add/remove: q = B/public_n, and the record never carries N
              "num_train_examples": 1000 if relation == "replace_one" else None,
              "public_n": 1000 if relation == "add_remove" else None}
    record.update(overrides)
    return f"{backbone}-{task}-{method}-{rho}-{epsilon}-{seed}.safetensors", record


def ledger(*releases):
    from dpmerge.privacy.ledger import ledger_of_records

    return ledger_of_records(list(releases))
