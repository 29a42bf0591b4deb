"""Does the answer depend on the study key? The demo's answer cells (DP-Merging - DP per backbone and operator,
paired 95 % t-intervals) from several results folders, each run with its own study key, side by side, and how
often one key's mean lies outside another key's interval; and, from the per-seed spread pooled over the keys, how
many seeds each cell needs for a 95 % interval no wider than --target-half-width; and each cell over every key's
seeds together (independent replications of one experiment: three keys of five seeds are fifteen seeds).

    .venv/bin/python bench/replication.py results_key1 results_key2 results_key3 [--markdown out.md]

What chance gives: if every key's releases are independent draws of the same experiment with normal per-seed
differences, key B's mean falls outside key A's 95 % interval with the probability printed below (simulated for
the seed count the folders have; it exceeds 5 % because B's mean is itself noisy: 12 % at five seeds, 17 % with
many). A rate far above it says the interval understates the spread between keys.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from dpmerge.report.answer import operators_in  # noqa: E402
from dpmerge.report.labels import AVERAGE_GAIN, METHOD_LABELS  # noqa: E402
from dpmerge.report.small_table import interval_cell  # noqa: E402


def answer_cells(results: Path) -> pd.DataFrame:
    """Every Table 1 of the folder: per (table, operator) DP-Merging - DP's mean, interval and seed count."""
    rows = []
    tables = sorted((results / "tables").glob("table1_*.parquet"))
    if not tables:
        raise SystemExit(f"{results}: no tables/table1_*.parquet (run make demo there first)")
    for path in tables:
        table = pd.read_parquet(path)
        for operator in operators_in(table):
            found = table[table["row"] == f"{METHOD_LABELS['dp_merging']} + {operator}"].iloc[0]
            rows.append({"table": path.stem.removeprefix("table1_"), "operator": operator,
                         "mean": found[AVERAGE_GAIN], "low": found[f"{AVERAGE_GAIN} ci95 low"],
                         "high": found[f"{AVERAGE_GAIN} ci95 high"], "seeds": int(found["seeds"])})
    return pd.DataFrame(rows)


def chance_rate(seeds: int, draws: int = 200_000, seed: int = 0) -> float:
    """P(mean of one key outside another key's 95 % t-interval) for independent normal samples of `seeds`."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((draws, seeds)), rng.standard_normal((draws, seeds))
    from scipy.stats import t

    half = t.ppf(0.975, seeds - 1) * a.std(axis=1, ddof=1) / np.sqrt(seeds)
    return float((np.abs(b.mean(axis=1) - a.mean(axis=1)) > half).mean())


def seeds_for(sd: float, target: float, most: int = 200) -> int | None:
    """The fewest seeds whose 95 % t-interval half-width t(n-1) sd / sqrt(n) is at most `target` (None: > most)."""
    from scipy.stats import t

    for n in range(2, most + 1):
        if t.ppf(0.975, n - 1) * sd / np.sqrt(n) <= target:
            return n
    return None


def pooled_sd(cells: dict, cell) -> float:
    """The per-seed standard deviation of one cell's paired difference, pooled over the keys (each key's recovered
    from its interval: half-width sqrt(n) / t(n-1))."""
    from scipy.stats import t

    variances = []
    for table in cells.values():
        row = table.loc[cell]
        n = int(row["seeds"])
        variances.append(((row["high"] - row["low"]) / 2 * np.sqrt(n) / t.ppf(0.975, n - 1)) ** 2)
    return float(np.sqrt(np.mean(variances)))


def pooled_interval(cells: dict, cell) -> tuple[float, float, float, int]:
    """(mean, low, high, seeds) of one cell over every key's seeds together: each key's seeds are independent
    replications of the same experiment, so k keys of n seeds are one experiment of k n seeds. The sample variance
    of all of them is exact from each key's (n, mean, sd): within-key sums of squares plus n (mean - grand)^2."""
    from scipy.stats import t

    rows = [table.loc[cell] for table in cells.values()]
    counts = np.array([int(row["seeds"]) for row in rows])
    means = np.array([float(row["mean"]) for row in rows])
    sds = np.array([(row["high"] - row["low"]) / 2 * np.sqrt(n) / t.ppf(0.975, n - 1) for row, n in zip(rows, counts)])
    total = int(counts.sum())
    grand = float((counts * means).sum() / total)
    variance = (((counts - 1) * sds ** 2).sum() + (counts * (means - grand) ** 2).sum()) / (total - 1)
    half = t.ppf(0.975, total - 1) * np.sqrt(variance / total)
    return grand, grand - half, grand + half, total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="results folders, each from its own study key")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument("--target-half-width", type=float, default=3.0,
                        help="the half-width (score points) the seeds column is computed for")
    args = parser.parse_args(argv)
    cells = {str(folder): answer_cells(folder).set_index(["table", "operator"]) for folder in args.results}
    keys = list(cells)
    index = cells[keys[0]].index
    together = sum(int(c["seeds"].min()) for c in cells.values())
    lines = ["| setting | operator | " + " | ".join(f"key {i + 1}" for i in range(len(keys)))
             + f" | all keys ({together} seeds) | per-seed SD (pooled) | seeds for ±{args.target_half_width:g} |",
             "|---|---|" + "---:|" * (len(keys) + 3)]
    outside = pairs = 0
    pooled_halves = []
    for cell in index:
        texts = []
        for key in keys:
            row = cells[key].loc[cell]
            texts.append(interval_cell(row["mean"], row["low"], row["high"], signed=True))
        sd = pooled_sd(cells, cell)
        needed = seeds_for(sd, args.target_half_width)
        mean, low, high, _ = pooled_interval(cells, cell)
        pooled_halves.append((high - low) / 2)
        lines.append(f"| {cell[0]} | {cell[1]} | " + " | ".join(texts)
                     + f" | {interval_cell(mean, low, high, signed=True)} | {sd:.1f} | "
                     + f"{needed if needed is not None else '> 200'} |")
        for a, b in itertools.permutations(keys, 2):
            ra, rb = cells[a].loc[cell], cells[b].loc[cell]
            pairs += 1
            outside += not (ra["low"] <= rb["mean"] <= ra["high"])
    seeds = int(cells[keys[0]]["seeds"].min())
    half = pd.concat([(c["high"] - c["low"]) / 2 for c in cells.values()])
    spread = pd.concat([c["mean"] for c in cells.values()], axis=1)
    summary = [
        "",
        f"{outside} of {pairs} (cell, ordered key pair) comparisons have one key's mean outside the other key's 95 % "
        f"interval ({100 * outside / pairs:.0f} %); independent replications at {seeds} seeds give "
        f"{100 * chance_rate(seeds):.0f} % by chance.",
        f"Half-widths: largest {half.max():.1f}, median {half.median():.1f} points; the largest spread of one cell's "
        f"means between keys {(spread.max(axis=1) - spread.min(axis=1)).max():.1f} points. Over all keys' seeds "
        f"together: largest half-width {max(pooled_halves):.1f}.",
    ]
    text = "\n".join(lines + summary) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
