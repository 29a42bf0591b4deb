"""The privacy ledger: one row per released task vector, checked as a whole, and what publishing it all costs.

Checks (each can fail, and `tests/test_privacy.py` makes each fail):
- every private row carries the full record, keyed randomness (`keyed` or `secure`), and spent <= target;
- the spent epsilon is recomputed from the record alone (sigma, q, steps by queries per step, delta,
  neighbouring relation, accountant) under the relation the record states and must agree with what the release
  claims; a second implementation must not find more (+0.3 %): for add/remove, dp_accounting's RDP against ours
  on the integer orders (RDP records), its PLD against the claim (PRV records), Opacus's PRV against the claim
  (PLD records); replace-one under Poisson sampling has one exact accountant (dp_accounting's PLD), whose second
  check is the next one;
- no claim may fall below the exact privacy of one test (privacy/lower_bound.py: the sum of the steps, by
  quadrature, sharing no code with any accountant), whatever the relation;
- an add/remove record must not carry the exact N (q, steps and delta come from its public size);
- within one release group (backbone, method and its swept settings, target epsilon, seed) each task appears once,
  so the group's release is (max epsilon, max delta)-DP by parallel composition over disjoint task datasets
  (paper, Thm. C.1);
- a merge statistic on private data is privatized and composed; one on public data names a dataset declared
  public that is no released task's training set;
- a post-processed release (`post_processing_of`: a denoised task vector, stages/denoise.py) is a function of
  one release alone, so it spends nothing: it must name, by tensor hash, a release the ledger holds, and carry
  that release's record unchanged; it composes nothing and is no second release of its task in its group.

Notes (not failures): delta = 1/N, the paper's convention, is weaker than common practice.

Composition across groups. Every fine-tune and every private statistic draws independent randomness from the
study key (privacy/study_key.py), so publishing several releases of one task's data (other budgets, methods, seeds,
sweep values, backbones, private statistics) is their composition, and `task_composition` computes it: the
ledger's "everything published" epsilon per task, by the PLD under the task's relation.
"""

from __future__ import annotations

import json
import logging
import math

import pandas as pd

from dpmerge.artifacts import POST_PROCESSING, PRIVACY_FIELDS, file_tensors_sha256, read_metadata
from dpmerge.epsilon import epsilon_column_value, epsilon_value
from dpmerge.privacy import rdp
from dpmerge.privacy.accounting import (
    RDP_ORDERS,
    accounted_size,
    composed_epsilon,
    record_epsilon,
    record_mechanisms,
    step_mechanisms,
)
from dpmerge.privacy.audit_ledger import audit_mechanisms
from dpmerge.privacy.lower_bound import lower_bound_epsilon
from dpmerge.privacy.randomness import RNG_MODES  # the keyed generators; anything else is replayable

# rho, anchor_lambda, lr, batch_size and weight_decay tell a sweep's runs (Tables 6, 7, the effective-noise study)
# apart from the method's default run
SWEPT = ["rho", "anchor_lambda", "lr", "batch_size", "weight_decay"]
GROUP = ["backbone", "method", *SWEPT, "target_epsilon", "seed"]
# Composition across releases: the PLD composes any mix of the records' mechanisms, exactly, under either relation.
COMPOSITION_ACCOUNTANT = "pld"
# Spent epsilon recomputed from a record must match the claimed one to this relative tolerance (the accountants
# are deterministic; the margin only absorbs JSON round-tripping of floats).
RECOMPUTE_TOLERANCE = 1e-6
# dp_accounting's RDP at fractional orders is a truncated series that fails at small sigma: at epsilon 16 in 38
# steps it drops orders 1.1-1.5 and is 1.1 % high at 1.6, where ours matches numerical integration (tests/
# test_privacy.py). Integer orders have a closed form in both codes, so the two are compared there: the same bound
# from two codes. Its PLD is within 1 % of PRV, and below it, for the budgets here.
INDEPENDENT_TOLERANCE = 3e-3
# Opacus's PRV returns the upper end of its estimate, eps_error above it at most: at its default 0.01 that is 1 % of
# an epsilon of 1, above the tolerance, so the second check asks it for 1e-3 (within 0.12 % of the PLD on the
# settings tested, 0.2-4.5 s a mechanism).
PRV_EPSILON_ERROR = 1e-3
INTEGER_RDP_ORDERS = [order for order in RDP_ORDERS if float(order).is_integer()]


def independent_epsilon(record: dict) -> tuple[float, float]:
    """(epsilon of a release by a second implementation from its record, the epsilon it is to be compared with);
    (NaN, NaN) where no second exact accountant exists (replace-one under Poisson sampling: the lower bound is
    the independent check there).

    The same Poisson-subsampled Gaussian steps, an accountant written by other people. For an RDP record both
    are RDP epsilons on the integer orders (exact in both codes): a fault in ours shows, and the claim itself is
    held to ours over every order by the recomputation. For PRV records, dp_accounting's PLD against the claim;
    for PLD records, Opacus's PRV against the claim."""
    if record["neighbouring"] != "add_remove":
        return math.nan, math.nan
    mechanisms = record_mechanisms(record)
    delta = float(record["delta"])
    if record["accountant"] == "pld":
        from opacus.accountants import create_accountant

        prv = create_accountant("prv")
        prv.history = [tuple(m) for m in mechanisms]
        return float(prv.get_epsilon(delta=delta, eps_error=PRV_EPSILON_ERROR)), epsilon_value(record["spent_epsilon"])
    if record["accountant"] == "prv":
        return composed_epsilon(mechanisms, delta, "pld", "add_remove"), epsilon_value(record["spent_epsilon"])
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant(orders=INTEGER_RDP_ORDERS)
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # dp_accounting logs each low order it cannot converge on
    try:
        for sigma, rate, steps in mechanisms:
            accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
                rate, dp_accounting.GaussianDpEvent(sigma)), steps))
        found = float(accountant.get_epsilon(delta))
    finally:
        logging.getLogger().setLevel(quiet)
    return found, rdp.epsilon(mechanisms, delta, INTEGER_RDP_ORDERS)


def accounted(record: dict) -> dict:
    """What the ledger computes from one private record: its epsilon recomputed under the record's relation,
    a second implementation's and what that is compared with, and the sum test's lower bound. A record whose
    accountant cannot account its relation gets NaN and the reason."""
    try:
        recomputed = record_epsilon(record)
        independent, reference = independent_epsilon(record)
        lower = lower_bound_epsilon(record_mechanisms(record), float(record["delta"]), record["neighbouring"])
    except ValueError as error:
        return {"recomputed_epsilon": math.nan, "independent_epsilon": math.nan, "independent_reference": math.nan,
                "lower_bound_epsilon": math.nan, "accounting_error": str(error)}
    return {"recomputed_epsilon": recomputed, "independent_epsilon": independent, "independent_reference": reference,
            "lower_bound_epsilon": lower, "accounting_error": ""}


def _is_private(method) -> bool:
    return method != "nonprivate"


def build_ledger(paths: list[str]) -> pd.DataFrame:
    """The ledger of release files; where some are post-processed releases, every release's tensor hash too
    (`tensors_sha256`, read only then: it reads every file whole), to find the release each one came from."""
    records = [(path, read_metadata(path)) for path in paths]
    table = ledger_of_records(records)
    if table["post_processing_of"].astype(bool).any():
        table["tensors_sha256"] = [file_tensors_sha256(path) if not derived else ""
                                   for path, derived in zip(paths, table["post_processing_of"])]
    return table


def derived_from(meta: dict) -> str:
    """The tensor hash of the release a post-processed release is a function of ('' for a release itself)."""
    return str((meta.get(POST_PROCESSING) or {}).get("tensors_sha256", ""))


# Everything record_epsilon and independent_epsilon read from a record. Releases that agree on these (a study's
# seeds, at one task's N) spend the same epsilon, so each distinct mechanism is accounted once, not per release.
ACCOUNTING_FIELDS = ("noise_multiplier", "sample_rate", "steps_by_queries", "neighbouring", "accountant", "delta")


def ledger_of_records(records: list[tuple[str, dict]]) -> pd.DataFrame:
    """One row per (path, release metadata)."""
    rows = []
    computed: dict[str, dict] = {}
    for path, meta in records:
        row = {"path": str(path), "task": meta.get("task"), "backbone": meta.get("backbone")}
        for field in PRIVACY_FIELDS:
            value = meta.get(field)
            if field in ("target_epsilon", "spent_epsilon"):
                value = epsilon_column_value(value)
            elif field == "steps_by_queries":
                value = json.dumps(value, sort_keys=True)
            row[field] = value
        settings = meta.get("hyperparameters") or {}
        for field in ("lr", "batch_size", "weight_decay"):
            row[field] = float(settings[field]) if field in settings else math.nan
        row["record_complete"] = all(field in meta for field in PRIVACY_FIELDS)
        row["post_processing_of"] = derived_from(meta)
        row["post_processing"] = str((meta.get(POST_PROCESSING) or {}).get("operation", ""))
        row["record_json"] = json.dumps({field: meta.get(field) for field in (*PRIVACY_FIELDS, "task", "backbone")},
                                        sort_keys=True)
        private = row["record_complete"] and _is_private(meta.get("method"))
        # The accountant's view of the release, from its record alone (the ledger recomputes, never trusts).
        row["mechanisms"] = json.dumps(record_mechanisms(meta)) if private else "[]"
        if private and "mixture" in meta:  # a random selection among releases at other budgets (dpmerge mix)
            from dpmerge.privacy.mixing import mixture_mechanisms, mixture_record_epsilon

            row["mechanisms"] = json.dumps(mixture_mechanisms(meta))
            # recomputed from its components by the PLD; no second accountant yet, so the column says so (NaN)
            row["recomputed_epsilon"], row["independent_epsilon"] = mixture_record_epsilon(meta), math.nan
            row["independent_reference"], row["lower_bound_epsilon"] = math.nan, math.nan
        elif private:
            key = json.dumps({field: meta[field] for field in ACCOUNTING_FIELDS}, sort_keys=True)
            if key not in computed:
                computed[key] = accounted(meta)
            row.update(computed[key])
        else:
            row["recomputed_epsilon"] = row["independent_epsilon"] = row["independent_reference"] = math.inf
            row["lower_bound_epsilon"] = 0.0
        row["accounting_error"] = row.get("accounting_error", "")
        row["public_n"] = meta.get("public_n")
        if row["post_processing_of"]:  # a function of a release the ledger composes already: spends nothing
            row["mechanisms"] = "[]"
        rows.append(row)
    return pd.DataFrame(rows)


def check_ledger(ledger: pd.DataFrame) -> list[str]:
    problems = []
    for row in ledger.itertuples():
        if not row.record_complete:
            problems.append(f"{row.path}: incomplete privacy record")
            continue
        if not _is_private(row.method):
            continue
        if row.randomness not in RNG_MODES:
            problems.append(f"{row.path}: randomness {row.randomness!r} is not keyed by a study key; anyone could "
                            "replay it")
        spent, target = epsilon_value(row.spent_epsilon), epsilon_value(row.target_epsilon)
        if spent > target:
            problems.append(f"{row.path}: spent epsilon {row.spent_epsilon} exceeds target {row.target_epsilon}")
        if row.neighbouring == "add_remove":
            if row.num_train_examples is not None and not pd.isna(row.num_train_examples):
                problems.append(f"{row.path}: an add/remove record carries the exact N ({row.num_train_examples}), "
                                "which differs between neighbours: membership is read off the record")
            if row.public_n is None or pd.isna(row.public_n):
                problems.append(f"{row.path}: an add/remove record without public_n: its q, steps and delta "
                                "depend on N")
        if row.accounting_error:
            problems.append(f"{row.path}: its record cannot be accounted as it states ({row.accounting_error})")
            continue
        if not math.isclose(row.recomputed_epsilon, spent, rel_tol=RECOMPUTE_TOLERANCE):
            problems.append(f"{row.path}: its record (sigma, q, steps, queries per step, delta) spends epsilon "
                            f"{row.recomputed_epsilon:.6f} under {row.neighbouring}, not the {row.spent_epsilon} "
                            "it claims")
        if row.lower_bound_epsilon > spent * (1 + INDEPENDENT_TOLERANCE):
            problems.append(f"{row.path}: it claims epsilon {row.spent_epsilon} under {row.neighbouring}, but an "
                            f"adversary who sums its steps already reaches {row.lower_bound_epsilon:.4f} at delta "
                            f"{row.delta:.3g} (privacy/lower_bound.py): the claim is false")
        if math.isnan(row.independent_epsilon):
            continue
        reference = row.independent_reference if not math.isnan(row.independent_reference) else spent
        if row.independent_epsilon > reference * (1 + INDEPENDENT_TOLERANCE):
            against = (f"the {row.spent_epsilon} it claims" if row.accountant != "rdp" else
                       f"{reference:.6f}, ours on the same RDP orders (it claims {row.spent_epsilon})")
            second = "Opacus's PRV" if row.accountant == "pld" else "dp_accounting"
            problems.append(f"{row.path}: an independent accountant ({second}) finds epsilon "
                            f"{row.independent_epsilon:.6f} for its record, above {against}")
    releases = _releases(ledger)
    if "status" in releases:  # an earlier release at a group's path (release log) was replaced, not added to it
        releases = releases[releases["status"] == "current"]
    for key, group in releases.groupby(GROUP, dropna=False):
        duplicated = group["task"][group["task"].duplicated()].tolist()
        if duplicated:
            problems.append(f"release group {key}: task(s) {duplicated} released twice (budgets would compose)")
    return problems + check_post_processed(ledger)


def _releases(ledger: pd.DataFrame) -> pd.DataFrame:
    """The rows that are releases, not post-processings of one."""
    if "post_processing_of" not in ledger or not len(ledger):
        return ledger
    return ledger[~ledger["post_processing_of"].astype(bool)]


def post_processing_verdicts(ledger: pd.DataFrame) -> dict[str, str]:
    """Per post-processed row's path, '' where it holds, else what is wrong: it must name, by tensor hash, a
    release the ledger holds, and carry that release's record unchanged (the same epsilon, delta, sigma, q, steps,
    seed, w0, task...): a function of that release alone spends nothing more, and nothing less may be claimed."""
    if "post_processing_of" not in ledger or not ledger["post_processing_of"].astype(bool).any():
        return {}
    hashes = ledger["tensors_sha256"] if "tensors_sha256" in ledger else pd.Series("", index=ledger.index)
    records = {h: r for h, r, d in zip(hashes, ledger["record_json"], ledger["post_processing_of"]) if h and not d}
    verdicts = {}
    for row in ledger[ledger["post_processing_of"].astype(bool)].itertuples():
        verdicts[row.path] = ""
        if row.post_processing_of not in records:
            verdicts[row.path] = (f"{row.path}: a post-processing ({row.post_processing}) of a release the ledger "
                                  f"does not hold (tensors {row.post_processing_of[:12]}...): its budget is "
                                  "accounted nowhere")
        elif records[row.post_processing_of] != row.record_json:
            release = json.loads(records[row.post_processing_of])
            differing = sorted(k for k, v in json.loads(row.record_json).items() if release.get(k) != v)
            verdicts[row.path] = (f"{row.path}: a post-processing ({row.post_processing}) whose record differs "
                                  f"from its release's in {', '.join(differing)}: post-processing keeps the "
                                  "release's record")
    return verdicts


def check_post_processed(ledger: pd.DataFrame) -> list[str]:
    return [problem for problem in post_processing_verdicts(ledger).values() if problem]


STATISTICS_COLUMNS = ["path", "kind", "source", "public_dataset", "backbone", "method", "target_epsilon", "seed",
                      "task", "examples", "sample_rate", "clip_norm", "noise_multiplier", "neighbouring",
                      "statistic_epsilon", "finetune_spent_epsilon", "total_epsilon", "task_vector_sha256"]


def build_statistics_ledger(paths: list[str]) -> pd.DataFrame:
    """One row per task of every merge-statistics file: its data source and, for private statistics, the
    budget composed with that task's fine-tuning."""
    return statistics_of_records([(path, read_metadata(path)) for path in paths])


def statistics_of_records(files: list[tuple[str, dict]]) -> pd.DataFrame:
    """build_statistics_ledger's table from each file's (path, metadata), e.g. as the release log holds them."""
    rows = []
    for path, meta in files:
        for record in meta.get("records", []):
            rows.append({"path": str(path), "kind": meta.get("kind"), "source": meta.get("source"),
                         "backbone": meta.get("backbone"), "method": meta.get("method"),
                         "target_epsilon": epsilon_column_value(meta.get("target_epsilon")),
                         "seed": meta.get("seed"),
                         **{k: (epsilon_column_value(v) if "epsilon" in k else v) for k, v in record.items()
                            if k in STATISTICS_COLUMNS}})
    return pd.DataFrame(rows, columns=STATISTICS_COLUMNS)


def check_statistics(statistics: pd.DataFrame, ledger: pd.DataFrame) -> list[str]:
    """Statistics of private data must be privatized (or belong to a non-private run) and name a task vector
    the ledger holds; public statistics must read a dataset that is no released task's training set."""
    problems = []
    released = set(ledger["task"].astype(str) + "|" + ledger["backbone"].astype(str))
    private_tasks = set(ledger["task"].astype(str))
    for row in statistics.itertuples():
        if row.source == "private" and _is_private(row.method) and pd.isna(row.total_epsilon):
            problems.append(f"{row.path}: private statistics of task {row.task} without a composed budget")
        if row.source == "public" and (pd.isna(row.public_dataset) or row.public_dataset in private_tasks):
            problems.append(f"{row.path}: 'public' statistics of task {row.task} read "
                            f"{row.public_dataset!r}, which is not a dataset outside every private training set")
        if f"{row.task}|{row.backbone}" not in released:
            problems.append(f"{row.path}: statistics of task {row.task} whose task vector is not in the ledger")
    return problems


def task_composition(ledger: pd.DataFrame, statistics: pd.DataFrame | None = None,
                     audits: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per task (one dataset, whichever backbones fine-tuned on it): every private release, private statistic and
    private audit run composed (`composed_epsilon`), and the epsilon of publishing everything in the ledger
    (`published_epsilon`), which a non-private release of the task makes infinite."""
    rows = []
    for task, everything in ledger.groupby("task"):
        group = _releases(everything)
        if not len(group):  # only post-processings of releases the ledger lacks: check_post_processed says so
            continue
        private = group[group["method"].map(_is_private)]
        mechanisms = [tuple(m) for value in private["mechanisms"] for m in json.loads(value)]
        audited, audit_runs = audit_mechanisms(audits, task)
        mechanisms += audited
        relations = set(private["neighbouring"].dropna())
        audit_deltas = [] if audits is None or not len(audits) else [
            float(d) for d in audits[(audits["task"] == task) & (audits["model"] == "individual")
                                     & (audits["group"] == "all")]["delta"]]
        count = 0
        if statistics is not None and len(statistics):
            drawn = statistics[(statistics["task"] == task) & (statistics["source"] == "private")
                               & statistics["method"].map(_is_private)]
            for row in drawn.itertuples():  # one query on one Poisson sample
                mechanisms += step_mechanisms(float(row.noise_multiplier), float(row.sample_rate), {1: 1})
                relations.add(row.neighbouring)
                count += 1
        delta = max([float(d) for d in private["delta"]] + audit_deltas, default=0.0)
        nonprivate = int((~group["method"].map(_is_private)).sum())
        # One guarantee composes only with another of the same relation; a task released under both is not
        # composed here (NaN), and the report says so.
        relation = relations.pop() if len(relations) == 1 else ("mixed" if relations else "")
        if not mechanisms:
            epsilon = 0.0
        elif relation == "mixed":
            epsilon = math.nan
        else:
            epsilon = composed_epsilon(mechanisms, delta, COMPOSITION_ACCOUNTANT, relation)
        rows.append({"task": task, "backbones": ", ".join(sorted(group["backbone"].astype(str).unique())),
                     "private_releases": len(private), "private_statistics": count,
                     "post_processed": len(everything) - len(group),
                     "private_audit_runs": audit_runs,
                     "nonprivate_releases": nonprivate,
                     "max_single_epsilon": max((epsilon_value(e) for e in private["spent_epsilon"]), default=0.0),
                     "composed_epsilon": epsilon, "published_epsilon": math.inf if nonprivate else epsilon,
                     "delta": delta, "neighbouring": relation})
    return pd.DataFrame(rows)


THREAT_MODEL = (
    "Threat model: an adversary sees every release (task vectors, heads, merged models, merge statistics) and "
    "its privacy record, and knows every training example but one. Logs, checkpoints and the study key "
    "(`private/study.key`) are private; every random draw is keyed by that key, so no release can be replayed. "
    "Neighbouring datasets: {relations}.")
RELATIONS = {"add_remove": "add/remove one example; q, the steps and delta come from a public size (public_n) and "
                           "no record carries N, which differs between such neighbours",
             "replace_one": "replace one example by another, N public (records carry it), accounted exactly by "
                            "dp_accounting's PLD"}


CHECK_VERDICTS = ("PASS", "FAIL")


def ledger_notes(ledger: pd.DataFrame) -> list[str]:
    """What holds but is weaker than it could be (not a failure): delta = 1/N, the paper's convention."""
    ledger = _releases(ledger)
    private = ledger[ledger["method"].map(_is_private)] if len(ledger) else ledger
    if not len(private):
        return []
    size = private.apply(lambda row: accounted_size(row)[1], axis=1).astype(float)
    at_one_over_n = private[private["delta"].astype(float) >= (1.0 / size) * (1 - 1e-9)]
    if not len(at_one_over_n):
        return []
    return [f"{len(at_one_over_n)} of {len(private)} private releases use delta = 1/N (the paper's convention), "
            "weaker than common practice: a mechanism that publishes one training example drawn at random, whole, "
            "is (0, 1/N)-DP, so delta = 1/N excludes no such mechanism. Common practice is delta << 1/N (e.g. "
            "finetune.delta: 1.0e-5 or 1/(10 N)); what that costs is in docs/privacy.md."]


def ledger_check(ledger: pd.DataFrame, problems: list[str], statistics: pd.DataFrame | None = None,
                 audits: pd.DataFrame | None = None) -> dict:
    """The check's outcome as data (privacy/ledger_check.json): what the answer page and other tools read instead
    of parsing the Markdown report. `independent_gap_percent` is the independent accountant's epsilon relative to
    what it is compared with (min and max, %): ours on the integer RDP orders, or the claim for PRV and
    replace-one records; None when no record is private. Post-processed releases are counted apart."""
    post_processed = len(ledger) - len(_releases(ledger))
    ledger = _releases(ledger)
    private = ledger[ledger["method"].map(_is_private)] if len(ledger) else ledger
    gap = lower = None
    if len(private):
        claimed = private["spent_epsilon"].map(epsilon_value)
        reference = private["independent_reference"].where(private["independent_reference"].notna(), claimed)
        relative = ((private["independent_epsilon"] / reference - 1) * 100).dropna()
        if len(relative):
            gap = {"min": float(relative.min()), "max": float(relative.max())}
        below = (private["lower_bound_epsilon"] / claimed).dropna()
        if len(below):
            lower = {"min": float(below.min()), "max": float(below.max())}
    earlier = ledger[ledger["status"] != "current"] if "status" in ledger and len(ledger) else ledger.iloc[0:0]
    return {"verdict": "FAIL" if problems else "PASS", "problems": list(problems), "notes": ledger_notes(ledger),
            "releases": int(len(ledger)), "private_releases": int(len(private)),
            "earlier_releases": {str(k): int(v) for k, v in earlier["status"].value_counts().items()}
            if len(earlier) else {},
            "post_processed": int(post_processed),
            "lower_bound_ratio": lower,
            "statistics": 0 if statistics is None else int(len(statistics)),
            "audits": 0 if audits is None else int(len(audits)), "independent_gap_percent": gap,
            "earlier_statistics": _by_status(statistics), "earlier_audits": _by_status(audits)}


def _by_status(table: pd.DataFrame | None) -> dict[str, int]:
    """How many rows of a statistics or audit table are earlier releases the log holds, per status."""
    if table is None or "status" not in table or not len(table):
        return {}
    return {str(k): int(v) for k, v in table["status"][table["status"] != "current"].value_counts().items()}


def _as_released(row) -> str:
    """A file's path, with its status when the release log holds it from an earlier run (gone or replaced)."""
    status = getattr(row, "status", "current")
    return row.path if status == "current" or not isinstance(status, str) else f"{row.path} ({status})"


def ledger_report(ledger: pd.DataFrame, problems: list[str], statistics: pd.DataFrame | None = None,
                  audits: pd.DataFrame | None = None, logged_runs: int | None = None) -> str:
    releases = _releases(ledger)
    derived = ledger.loc[ledger.index.difference(releases.index)]
    earlier = releases[releases["status"] != "current"] if "status" in releases else releases.iloc[0:0]
    lines = _report_opening(ledger, releases, derived, earlier, logged_runs)
    lines += _groups_section(releases.drop(earlier.index))
    if len(derived):
        lines += _post_processed_section(ledger, derived)
    lines += _composition_section(task_composition(ledger, statistics, audits))
    if statistics is not None and len(statistics):
        lines += _statistics_section(statistics)
    if audits is not None:
        from dpmerge.privacy.audit_ledger import audit_report

        lines += audit_report(audits)
    if len(earlier):
        lines += ["", "## Earlier releases (from the release log)", "",
                  "A release is forever: once written it may have been published, so each counts in its task's "
                  "composition whatever became of its file.", "",
                  "| path (as released) | status | method | target eps | seed | task |", "|---|---|---|---|---|---|"]
        lines += [f"| {row.path} | {row.status} | {row.method} | {row.target_epsilon} | {row.seed} | {row.task} |"
                  for row in earlier.itertuples()]
    return "\n".join(lines + _check_section(ledger_check(ledger, problems, statistics, audits), problems)) + "\n"


def _report_opening(ledger, releases, derived, earlier, logged_runs) -> list[str]:
    relations = sorted(set(ledger.get("neighbouring", pd.Series(dtype=str)).dropna()))
    return ["# Privacy ledger", "", f"{len(releases)} released task vectors"
            + (f", and {len(derived)} post-processings of them." if len(derived) else ".")
            + (f" {len(earlier)} of them the release log holds from earlier runs, their files no longer as "
               "released; they count in every composition below (listed at the end)." if len(earlier) else "")
            + (f" The study's release log holds {logged_runs} released runs (fine-tunes' task vectors and heads, "
               "private statistics, audit runs, mixtures), every one written in this results folder; every file "
               "here was checked against it."
               if logged_runs is not None else ""), "",
            THREAT_MODEL.format(relations="; ".join(RELATIONS.get(r, r) for r in relations) or "none recorded"),
            ""]


def _groups_section(releases: pd.DataFrame) -> list[str]:
    lines = ["## Release groups (parallel composition over disjoint task datasets)", ""]
    lines += ["Each group is one experiment's release: its tasks' datasets are disjoint, so the group is (max "
              "epsilon, max delta)-DP. Groups on the same tasks (other budgets, seeds, methods or swept settings) "
              "draw independent randomness; publishing several composes their budgets (next section).", ""]
    lines += ["Claimed: the largest epsilon a release of the group claims. Recomputed: the same from its record "
              "alone, under the relation it states (dp_accounting's PLD for pld records). Lower bound: the exact "
              "epsilon of one adversary, who sums the steps (privacy/lower_bound.py); no claim may be below it.", ""]
    lines += ["| backbone | method | rho | lambda | lr | B | wd | target eps | seed | tasks | relation | "
              "claimed eps | recomputed eps | lower bound | max delta |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, group in releases.groupby(GROUP, dropna=False):
        spent = max(epsilon_value(v) for v in group["spent_epsilon"])
        recomputed = group["recomputed_epsilon"].astype(float).max()
        lower = group["lower_bound_epsilon"].astype(float).max()
        delta = pd.to_numeric(group["delta"], errors="coerce").max()  # NaN where no record states one
        backbone, method, rho, anchor_lambda, lr, batch_size, weight_decay, target, seed = key
        settings = " | ".join("--" if math.isnan(v) else f"{v:g}" for v in (lr, batch_size, weight_decay))
        relation = ", ".join(sorted(set(group["neighbouring"].dropna().astype(str)))) or "--"
        lines.append(f"| {backbone} | {method} | {rho:g} | {anchor_lambda:g} | {settings} | {target} | {seed} | "
                     f"{len(group)} | {relation} | {spent:.4f} | {recomputed:.4f} | {lower:.4f} | {delta:.3g} |")
    return lines


def _post_processed_section(ledger: pd.DataFrame, derived: pd.DataFrame) -> list[str]:
    lines = ["", "## Post-processed releases (no budget of their own)", "",
             "Each is a function of one release alone (its tensors, no data), so it spends nothing: it names "
             "that release by tensor hash, which the ledger finds among its releases, and keeps its record.",
             "", "| operation | backbone | method | target eps | files | their release found, record kept |",
             "|---|---|---|---|---|---|"]
    verdicts = post_processing_verdicts(ledger)
    for (operation, backbone, method, target), group in derived.groupby(
            ["post_processing", "backbone", "method", "target_epsilon"], dropna=False, sort=True):
        found = sum(not verdicts[path] for path in group["path"])
        lines.append(f"| {operation} | {backbone} | {method} | {target} | {len(group)} | {found} of "
                     f"{len(group)} |")
    return lines


def _composition_section(composition: pd.DataFrame) -> list[str]:
    lines = ["", "## Everything published, composed per task", "",
             "Every private release, private statistic and private audit run of the ledger that read a task's "
             "data, composed "
             f"({COMPOSITION_ACCOUNTANT.upper()}, at the task's delta): the epsilon of publishing all of them "
             "together. The non-private reference is a baseline to compare against, not a release: publishing "
             "it too would leave its task's data unprotected (last column).", "",
             "| task | backbones | relation | private releases | private statistics | private audit runs | "
             "max single eps | composed eps | delta | non-private releases | with them published |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in composition.itertuples():
        composed = "not composed (mixed relations)" if row.neighbouring == "mixed" else f"{row.composed_epsilon:.4f}"
        lines.append(f"| {row.task} | {row.backbones} | {row.neighbouring or '--'} | {row.private_releases} | "
                     f"{row.private_statistics} | {row.private_audit_runs} | "
                     f"{row.max_single_epsilon:.4f} | {composed} | {row.delta:.3g} | "
                     f"{row.nonprivate_releases} | {row.published_epsilon:.4g} |")
    return lines


def _statistics_section(statistics: pd.DataFrame) -> list[str]:
    lines = ["", "## Merge statistics (RegMean Grams, Fisher)", "",
             "Public statistics read a dataset declared public, outside every private training set (no "
             "privacy cost). Private ones are Poisson-sampled at rate q from the study key, clipped and "
             "noised, and compose with the task's fine-tuning: the total is the task's budget once that merge "
             "is released.", "",
             "| file | kind | data | method | target eps | task | examples | q | sigma | total eps |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in statistics.itertuples():
        total = "--" if pd.isna(row.total_epsilon) else f"{epsilon_value(row.total_epsilon):.4f}"
        sigma = "--" if pd.isna(row.noise_multiplier) else f"{float(row.noise_multiplier):.3f}"
        rate = "--" if pd.isna(row.sample_rate) else f"{float(row.sample_rate):.3f}"
        data = f"public: {row.public_dataset}" if row.source == "public" else "private"
        lines.append(f"| {_as_released(row)} | {row.kind} | {data} | {row.method} | {row.target_epsilon} | "
                     f"{row.task} | {row.examples} | {rate} | {sigma} | {total} |")
    return lines


def _check_section(check: dict, problems: list[str]) -> list[str]:
    lines = ["", "## Check", ""]
    if (gap := check["independent_gap_percent"]) is not None:
        lines += [f"Second accountant on the add/remove records: {gap['min']:+.3f} % to {gap['max']:+.3f} % of "
                  "what it is compared with.", ""]
    if (lower := check["lower_bound_ratio"]) is not None:
        lines += [f"Sum-test lower bound on the {check['private_releases']} private records: {lower['min']:.3f} to "
                  f"{lower['max']:.3f} of the claimed epsilon (above 1 would expose a false claim).", ""]
    lines += [f"- FAIL: {p}" for p in problems] or [
        "- every record complete, keyed, within its budget, its epsilon recomputed from the record under the "
        "relation it states, not exceeded by a second accountant and not below the sum test's lower bound: PASS"]
    lines += [f"- NOTE: {note}" for note in check["notes"]]
    return lines
