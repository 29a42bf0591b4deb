# Denoised releases (config merge.<entry>.denoise, denoise_study:; rules in workflow/rules/denoise.smk): which
# releases are denoised, by which method, and the study's inputs. Denoising reads only the released vector: it is
# post-processing, and the ledger holds every denoised file beside the release it came from, at no new budget.
from dpmerge.catalog import denoised_counterpart

DENOISE_STUDY = config["denoise_study"]
DENOISE_TABLE = result("tables/denoised_releases")
FIGURE_DENOISE = result("figures/denoised_releases")


def denoised_entries(merges):
    """(entry, denoiser) of the merges that denoise their inputs."""
    return [(name, config["merge"][name]["denoise"]) for name in merges if "denoise" in config["merge"][name]]


def all_denoised_vectors():
    """Every denoised release some merge reads: per release group, each denoiser its merges use, every task."""
    files = []
    for g in all_groups():
        for denoiser in dict.fromkeys(d for _, d in denoised_entries(g["merges"])):
            files += [
                DENOISED_TV.format(denoiser=denoiser, task=t, **g) for t in config["backbones"][g["backbone"]]["tasks"]
            ]
    return list(dict.fromkeys(files))


def denoise_study_groups():
    """The main grid's release groups of naive DP and DP-Merging (the study's question), at private budgets."""
    if not DENOISE_STUDY["operators"]:
        return []
    return [g for g in release_grid() if g["method"] in (BASELINE, PROPOSED)]


def denoise_study_pretrained():
    """The Pretrained row's individual scores (w0 + a DP head), where the grid has it."""
    if not DENOISE_STUDY["operators"]:
        return []
    return [SCORES_INDIVIDUAL.format(**g) for g in release_grid() if head_only(g["method"])]


def denoise_pairs():
    """'denoised=plain' per studied entry, for the report."""
    return " ".join(f"{name}={denoised_counterpart(config, name)}" for name in DENOISE_STUDY["operators"])


def denoise_study_vectors():
    """The denoised releases the study's groups merge (their metadata: what denoising found)."""
    denoisers = dict.fromkeys(config["merge"][name]["denoise"] for name in DENOISE_STUDY["operators"])
    return [
        DENOISED_TV.format(denoiser=d, task=t, **g)
        for g in denoise_study_groups()
        for d in denoisers
        for t in config["backbones"][g["backbone"]]["tasks"]
    ]


def denoise_targets():
    if not DENOISE_STUDY["operators"]:
        return []
    return (
        [DENOISE_TABLE + ext for ext in (".parquet", ".md", ".tex")]
        + [f"{DENOISE_TABLE}_noise{ext}" for ext in (".parquet", ".md", ".tex")]
        + [FIGURE_DENOISE + ext for ext in FIGURE_EXTENSIONS]
    )
