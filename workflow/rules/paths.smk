# Where every result lies: one pattern per kind of file, under the results folder.

# The study's secret key (dpmerge/privacy/study_key.py): created by the first job that needs it, never an output,
# passed by path in commands (not a parameter: where it lies is not a setting of any result).
STUDY_KEY = result("private/study.key")
# Every release the study ever wrote, appended by the fine-tunes before they publish (privacy/release_log.py)
RELEASE_LOG = result("private/releases.jsonl")
TV = result("taskvectors/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
HEAD = result("heads/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
DATA = result("data/{backbone}/{task}.pt")
ZEROSHOT_HEAD = result("zeroshot_heads/{backbone}/{task}.safetensors")
PRETRAINED = result("pretrained/{backbone}.safetensors")
MERGED = result("merged/{backbone}/{eps}/{method}/{seed}/{operator}.safetensors")
SCORES_INDIVIDUAL = result("scores/individual/{backbone}/{eps}/{method}/{seed}.parquet")
SCORES_MERGED = result("scores/merged/{backbone}/{eps}/{method}/{seed}/{operator}.parquet")
DRIFT = result("diagnostics/drift/{backbone}/{eps}/{method}/{seed}.parquet")
INTERPOLATION = result("diagnostics/interpolation/{backbone}/{eps}/{method}/{seed}.parquet")
CURVATURE = result("diagnostics/curvature/{backbone}/{eps}/{method}/{seed}.parquet")
LANDSCAPE = result("diagnostics/landscape/{backbone}/{eps}/{method}/{seed}.parquet")
LINEARITY = result("diagnostics/linearity/{backbone}/{eps}/{method}/{seed}.parquet")
TABLE1 = result("tables/table1_{backbone}_{eps}")
TABLE4 = result("tables/table4_epsilon_sweep")
TABLE5 = result("tables/table5_ablation_{backbone}_{eps}")
TABLE6 = result("tables/table6_rho_{backbone}")
TABLE7 = result("tables/table7_lambda_{backbone}")
TABLE8 = result("tables/table8_operators_{backbone}_{eps}")
TABLES_INDEX = result("tables/index.md")
SIGNAL_CHECK = result("tables/signal_check")  # .parquet, .md, .tex: each task's individual models against chance
FIGURE_ANSWER = result("figures/answer_forest")  # the answer page's forest plot
FIGURE_INTERPOLATION = result("figures/interpolation_{backbone}_{eps}")
FIGURE_SHARPNESS_DRIFT = result("figures/sharpness_drift_{backbone}")
FIGURE_GAP_BOUND = result("figures/gap_vs_bound_{backbone}")
FIGURE_LANDSCAPE = result("figures/landscape_{backbone}_{eps}")
LEDGER_TABLE = result("privacy/ledger.parquet")
LEDGER_STATISTICS = result("privacy/merge_statistics.parquet")
LEDGER_REPORT = result("privacy/ledger.md")
LEDGER_CHECK = result("privacy/ledger_check.json")  # the check's verdict as data (what the answer page reads)
TABLE_EXTENSIONS = (".parquet", ".md", ".tex", ".html")
FIGURE_EXTENSIONS = (".png", ".pdf")
PROTOCOL_CHOICE = result("protocol/choice.md")
ANSWER = result("answer.md")
ANSWER_RST = result("answer.rst")
STATISTICS = result("statistics/{backbone}/{eps}/{method}/{seed}/{operator}.safetensors")
# A release denoised from the vector alone (dpmerge denoise): post-processing, read by merges with `denoise`
DENOISED_TV = result("denoised/{denoiser}/taskvectors/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")


# A CLIP backbone's tasks start from their zero-shot heads; the others train a fresh head.
def zeroshot_head_input(wildcards):
    return [ZEROSHOT_HEAD.format(**wildcards)] if zeroshot_heads(wildcards.backbone) else []
