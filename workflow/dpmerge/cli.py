"""Command line interface: one subcommand per pipeline stage (`dpmerge --help`).

Every Snakemake rule calls one of these; each also works by hand on files a researcher already has. This module
only parses (the parser is cli_arguments.py), checks what can be checked from the arguments alone, and calls
the stage (dpmerge.stages); a stage's ValueError or FileNotFoundError becomes an `error: ...` exit.
"""

from __future__ import annotations

import json
import math
import sys

from dpmerge import runtime
from dpmerge.cli_arguments import build_parser
from dpmerge.stages import audit, diagnose, evaluate, finetune, ledger, merge, mix, noise_scale, prepare, report


def _json_arg(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise SystemExit(f"error: {what} is not valid JSON ({error}): {text!r}")
    if not isinstance(value, dict):
        raise SystemExit(f"error: {what} must be a JSON object, got {text!r}")
    return value


def _spec(args) -> dict:
    return _json_arg(args.backbone_spec, "--backbone-spec")


def _parse_params(pairs: list[str]) -> dict:
    params = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"error: --param expects key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        try:
            params[key] = json.loads(raw)
        except json.JSONDecodeError:
            params[key] = raw
    return params


# ------------------------------------------------------------------------------------------------ commands


def cmd_prepare(args) -> None:
    runtime.set_threads(args.threads)
    prepare.prepare(backbone=args.backbone, backbone_spec=_spec(args), task=args.task, out=args.out,
                    max_train=args.max_train or None, max_test=args.max_test or None, data_seed=args.data_seed,
                    data_dir=args.data_dir, workers=args.workers, validation_fraction=args.validation_fraction)


def cmd_pretrained(args) -> None:
    runtime.set_threads(1)
    prepare.pretrained(backbone=args.backbone, backbone_spec=_spec(args), out=args.out)


def cmd_zeroshot_head(args) -> None:
    runtime.set_threads(args.threads)
    prepare.zeroshot_head(backbone=args.backbone, backbone_spec=_spec(args), data=args.data, out=args.out)


def cmd_prepare_data(args) -> None:
    prepare.prepare_data(task=args.task, data_dir=args.data_dir)


def cmd_make_standins(args) -> None:
    prepare.make_standins(out=args.out, vision_classes=args.vision_classes, train_per_class=args.train_per_class,
                          test_per_class=args.test_per_class, image_size=args.image_size, seed=args.seed)


def cmd_finetune(args) -> None:
    from dpmerge.catalog import parse_label

    runtime.set_threads(args.threads)
    spec = _spec(args)
    hparams = _json_arg(args.hparams, "--hparams")
    try:
        method, swept = parse_label(args.method)
    except ValueError as error:
        raise SystemExit(f"error: --method: {error}")
    for parameter, value in swept.items():
        # A sweep's label and the settings it ran with must agree, or its tables would file it under a wrong value
        if parameter not in hparams or float(hparams[parameter]) != value:
            raise SystemExit(f"error: --method {args.method} says {parameter} = {value:g}, but --hparams gives "
                             f"{hparams.get(parameter, 'no value')}")
    finetune.finetune(backbone=args.backbone, backbone_spec=spec, data=args.data, method_label=args.method,
                      method=method, hparams=hparams, epsilon=args.epsilon, seed=args.seed, study_key=args.study_key,
                      out_vector=args.out_vector, out_head=args.out_head, checkpoint=args.checkpoint,
                      checkpoint_every=args.checkpoint_every, zeroshot_head=args.zeroshot_head)


def cmd_audit(args) -> None:
    runtime.set_threads(args.threads)
    audit.audit(backbone=args.backbone, backbone_spec=_spec(args), data=args.data, method=args.method,
                hparams=_json_arg(args.hparams, "--hparams"), epsilon=args.epsilon, seed=args.seed,
                study_key=args.study_key, out=args.out, canaries=args.canaries, audit_delta=args.audit_delta,
                confidence=args.confidence, zeroshot_head=args.zeroshot_head, kind=args.kind,
                keep_run=args.keep_run, groups=_named_groups(args.group))


def _named_groups(items: list[str]) -> dict[str, list[str]]:
    groups = {name: [c for c in classes.split(",") if c] for name, classes in _named_paths(items, "--group").items()}
    if empty := [name for name, classes in groups.items() if not classes]:
        raise ValueError(f"--group {empty[0]}=: name at least one class")
    return groups


def cmd_audit_report(args) -> None:
    audit.audit_report(audit_files=args.audits, out_prefix=args.out_prefix, figure=args.figure)


def cmd_audit_merge(args) -> None:
    runtime.set_threads(args.threads)
    audit.audit_merged(runs=args.runs, operator=args.method, params=_parse_params(args.param),
                       backbone_spec=_spec(args), out=args.out, keep_scores=args.keep_scores)


def cmd_audit_pool(args) -> None:
    audit.audit_pooled(runs=args.runs, merged=args.merged, out=args.out)


def cmd_mix(args) -> None:
    mix.mix(task_vectors=args.task_vectors, heads=args.heads, target_epsilon=args.target_epsilon, delta=args.delta,
            utilities=args.utilities, study_key=args.study_key, rng=args.rng, out_vector=args.out_vector,
            out_head=args.out_head)


def cmd_combine(args) -> None:
    mix.combine(task_vectors=args.task_vectors, heads=args.heads, target_epsilon=args.target_epsilon,
                weights=args.weights, seed=args.seed, out_vector=args.out_vector, out_head=args.out_head)


def cmd_mix_report(args) -> None:
    mix.mix_report(mixed=args.mixed, vectors=args.vectors, trained=args.trained, out_prefix=args.out_prefix,
                   figure=args.figure, combined=args.combined, combined_vectors=args.combined_vectors)


def cmd_noise_scale(args) -> None:
    noise_scale.noise_scale(backbone_spec=_spec(args), base=args.base, task_vectors=args.task_vectors,
                            heads=args.heads, data=args.data, individual=args.individual, merged=args.merged,
                            interpolation=args.interpolation, label=args.label, sweep=args.sweep, out=args.out,
                            max_examples=args.max_examples)


def cmd_noise_report(args) -> None:
    noise_scale.noise_report(rows=args.rows, out_prefix=args.out_prefix, figure=args.figure)


def cmd_merge(args) -> None:
    merge.merge(operator=args.method, params=_parse_params(args.param), task_vectors=args.task_vectors,
                base=args.base, out=args.out, vectors=args.vectors, name=args.name, statistics=args.statistics,
                require_privacy_record=args.require_privacy_record, allow_single=args.allow_single)


def cmd_statistics(args) -> None:
    runtime.set_threads(args.threads)
    if not (len(args.task_vectors) == len(args.heads) == len(args.data)):
        raise SystemExit("error: give one --task-vectors, --heads and --data file per task, in the same order")
    if args.source == "private" and (args.clip_norm is None or args.epsilon is None or args.study_key is None):
        raise SystemExit("error: --source private needs --clip-norm, --epsilon (the statistic's own budget) and "
                         "--study-key (its sampler and noise are keyed by the study's secret key)")
    if args.source == "public" and not args.public_data:
        raise SystemExit("error: --source public needs --public-data: the prepared file ('dpmerge prepare') of a "
                         "dataset declared public, outside every private training set")
    if args.source == "private" and args.public_data:
        raise SystemExit("error: --public-data is read only with --source public")
    merge.statistics(backbone_spec=_spec(args), kind=args.kind, source=args.source, base=args.base,
                     task_vectors=args.task_vectors, heads=args.heads, data=args.data, out=args.out,
                     examples=args.examples, clip_norm=args.clip_norm, epsilon=args.epsilon,
                     study_key=args.study_key, public_data=args.public_data)


def cmd_evaluate(args) -> None:
    runtime.set_threads(args.threads)
    evaluate.evaluate(backbone_spec=_spec(args), base=args.base, heads=args.heads, data=args.data, out=args.out,
                      merged=args.merged, task_vectors=args.task_vectors, own_task_only=args.own_task_only)


def cmd_drift(args) -> None:
    diagnose.drift(base=args.base, task_vectors=args.task_vectors, out=args.out)


def cmd_interpolate(args) -> None:
    runtime.set_threads(args.threads)
    diagnose.interpolate(backbone_spec=_spec(args), base=args.base, merged=args.merged,
                         task_vectors=args.task_vectors, heads=args.heads, data=args.data, out=args.out,
                         points=args.points, max_examples=args.max_examples)


def cmd_curvature(args) -> None:
    runtime.set_threads(args.threads)
    if not args.rho > 0:
        raise SystemExit(f"error: --rho must be > 0, got {args.rho}")
    if args.iterations < 1 or args.max_examples < 1:
        raise SystemExit(f"error: --iterations and --max-examples must be >= 1, got {args.iterations}, "
                         f"{args.max_examples}")
    if not args.gammas or any(not 0 <= g <= 1 for g in args.gammas) or args.gammas[0] != 0:
        raise SystemExit(f"error: --gammas must start at 0 and lie in [0, 1], got {args.gammas}")
    diagnose.curvature(backbone_spec=_spec(args), base=args.base, merged=args.merged, task_vectors=args.task_vectors,
                       heads=args.heads, data=args.data, out=args.out, rho=args.rho, iterations=args.iterations,
                       tolerance=args.tolerance, gammas=args.gammas, max_examples=args.max_examples)


def cmd_landscape(args) -> None:
    runtime.set_threads(args.threads)
    if args.points < 3:
        raise SystemExit(f"error: --points must be >= 3 (the merged model and both sides of it), got {args.points}")
    if not (args.span > 0 and math.isfinite(args.span)):
        raise SystemExit(f"error: --span must be a finite number > 0, got {args.span}")
    if args.max_examples < 1:
        raise SystemExit(f"error: --max-examples must be >= 1, got {args.max_examples}")
    if args.plane == "task_vectors" and len(args.task_vectors or []) < 2:
        raise SystemExit(f"error: --plane task_vectors needs at least two --task-vectors (the first two span the "
                         f"plane), got {len(args.task_vectors or [])}")
    diagnose.landscape(backbone_spec=_spec(args), base=args.base, merged=args.merged, heads=args.heads,
                       data=args.data, out=args.out, task_vectors=args.task_vectors, plane=args.plane,
                       points=args.points, span=args.span, max_examples=args.max_examples, seed=args.seed)


def cmd_linearity(args) -> None:
    runtime.set_threads(args.threads)
    if not args.alphas or any(not 0 < a < 1 for a in args.alphas):
        raise SystemExit(f"error: --alphas must lie strictly between 0 and 1, got {args.alphas}")
    lambda_max, measured_on = diagnose.curvature_lambdas(args.curvature)
    diagnose.linearity(curvature=args.curvature, lambda_max=lambda_max, measured_on=measured_on,
                       backbone_spec=_spec(args), base=args.base, task_vectors=args.task_vectors, heads=args.heads,
                       data=args.data, out=args.out, alphas=args.alphas, max_examples=args.max_examples)


def cmd_table(args) -> None:
    report.table(kind=args.kind, scores=args.scores, out_prefix=args.out_prefix, caption=args.caption,
                 operator=args.operator, metric_in_header=args.metric_in_header)


def cmd_plot_sharpness_drift(args) -> None:
    report.plot_sharpness_drift(curvature=args.curvature, drift=args.drift, out=args.out, title=args.title)


def cmd_plot_gap_bound(args) -> None:
    report.plot_gap_bound(curvature=args.curvature, out=args.out, title=args.title)


def cmd_plot_interpolation(args) -> None:
    report.plot_interpolation(curves=args.curves, out=args.out, title=args.title)


def cmd_plot_landscape(args) -> None:
    report.plot_landscape(landscapes=args.landscapes, out=args.out, title=args.title)


def cmd_ledger(args) -> None:
    ledger.ledger(task_vectors=args.task_vectors, out=args.out, report=args.report, statistics=args.statistics,
                  statistics_out=args.statistics_out, check_out=args.check_out, audits=args.audits,
                  audits_out=args.audits_out)


def cmd_answer(args) -> None:
    report.answer(tables=_named_paths(args.table1, "--table1"), ledger=args.ledger, out_markdown=args.out_markdown, out_rst=args.out_rst,
                  links=args.link, description=args.description, audit_table=args.audit_table)


def _named_paths(items: list[str], flag: str) -> dict[str, str]:
    named = {}
    for item in items:
        name, separator, path = item.rpartition("=")
        if not separator or not name:
            raise ValueError(f"{flag} {item!r}: expected NAME=PATH")
        named[name] = path
    return named


def cmd_select_budget(args) -> None:
    try:
        candidates = json.loads(args.candidates)
    except json.JSONDecodeError as error:
        raise ValueError(f"--candidates is not JSON: {error}") from None
    report.select_budget(candidates=candidates, tables=_named_paths(args.table1, "--table1"), seeds=args.seeds,
                         out_markdown=args.out_markdown, out_parquet=args.out_parquet)


COMMANDS = {
    "prepare": cmd_prepare, "zeroshot-head": cmd_zeroshot_head, "prepare-data": cmd_prepare_data,
    "make-standins": cmd_make_standins, "pretrained": cmd_pretrained, "finetune": cmd_finetune, "audit": cmd_audit, "audit-merge": cmd_audit_merge,
    "audit-pool": cmd_audit_pool,
    "audit-report": cmd_audit_report,
    "merge": cmd_merge,
    "mix": cmd_mix,
    "combine": cmd_combine,
    "mix-report": cmd_mix_report,
    "noise-scale": cmd_noise_scale,
    "noise-report": cmd_noise_report,
    "statistics": cmd_statistics, "evaluate": cmd_evaluate, "drift": cmd_drift, "linearity": cmd_linearity,
    "curvature": cmd_curvature, "interpolate": cmd_interpolate, "landscape": cmd_landscape, "table": cmd_table,
    "plot-sharpness-drift": cmd_plot_sharpness_drift, "plot-gap-bound": cmd_plot_gap_bound,
    "plot-interpolation": cmd_plot_interpolation, "plot-landscape": cmd_plot_landscape, "ledger": cmd_ledger,
    "answer": cmd_answer, "select-budget": cmd_select_budget,
}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    runtime.tune_allocator()
    runtime.make_torchvision_importable()
    try:
        COMMANDS[args.command](args)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}")


if __name__ == "__main__":
    main(sys.argv[1:])
