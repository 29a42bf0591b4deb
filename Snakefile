# dpmerge: private fine-tuning -> task vectors -> data-free merging -> evaluation, diagnostics, tables.
# Run: snakemake --cores 2 --configfile config.yaml --workflow-profile profiles/local
import os
import sys

from snakemake.utils import min_version

min_version("9.20")

# The rules import the torch-free catalog (workflow/dpmerge/catalog.py) while Snakemake parses them: from this
# checkout, also where the package is not installed beside Snakemake (under --sdm conda it is installed only in
# the jobs' env).
sys.path.insert(0, os.path.join(workflow.basedir, "workflow"))

# Where envs/dpmerge.yaml installs the package from under --sdm conda (its pip line reads ${DPMERGE_SOURCE}):
# this checkout, wherever Snakemake puts its copy of the env file and whichever directory the run is in.
os.environ.setdefault("DPMERGE_SOURCE", workflow.basedir)

# Jobs on this machine start by forking a warm process that has torch and the models imported (seconds saved
# per job, identical outputs: workflow/dpmerge/forkserver.py). DPMERGE_FORKSERVER=0 turns it off, e.g. to read
# a job's memory from its benchmark file; cluster jobs never use it.
if workflow.is_main_process and workflow.local_exec and not workflow.dryrun:
    os.environ.setdefault("DPMERGE_FORKSERVER", "1")


# Each running GPU job sees only its own GPU (workflow/dpmerge/gpu_slots.py): with --resources gpu=N (or the
# profile's `resources`), local jobs share a pool of N device ids, and a job whose rule asked for a GPU claims
# one before it starts. Slurm assigns devices itself.
if workflow.is_main_process and workflow.local_exec:
    from dpmerge import gpu_slots

    os.environ[gpu_slots.SLOTS_VARIABLE] = ",".join(
        gpu_slots.local_pool(gpu_slots.granted(workflow.global_resources), os.environ.get("CUDA_VISIBLE_DEVICES"))
    )


# The embedded default, unless the command line names the experiment: a preset (--configfile presets/...) is a
# whole configuration and must not be merged with this one (its backbones would be added to the preset's).
if not workflow.config_settings.configfiles:

    configfile: "config.yaml"


include: "workflow/rules/settings.smk"
include: "workflow/rules/paths.smk"


# Noise calibrations, kept for the run's other jobs (privacy/pld.py): hundreds of fine-tunes share a handful of
# (epsilon, delta, q, steps) settings, and each search takes ~0.5 s. Public numbers only; every job rechecks the
# value it reads.
os.environ.setdefault("DPMERGE_CALIBRATION_CACHE", os.path.abspath(os.path.join(RESULTS, ".calibration")))


# Private stays private (workflow/dpmerge/private_folders.py): the folders of the results that hold private data
# or side channels (the study key and kept audit runs, prepared data, checkpoints, logs, benchmarks) are made
# 0700 before any job runs, so nothing a job writes there is ever reachable by others, and everything in them
# 0700/0600 now (what an older or interrupted run left) and when the run ends. Releases keep the umask's modes.
# While the Snakefile is parsed, a dry run cannot be told from a run (workflow.dryrun is not known yet), so only
# what exists is tightened here (an older study's folders, also when a rerun finds nothing to do); onstart, which
# runs before the first job and never on a dry run, creates the folders.
# A key others could read is refused first, never made private silently (private_folders.check_key).
if workflow.is_main_process and os.path.isdir(RESULTS):
    from dpmerge import private_folders

    private_folders.check_key(RESULTS)
    private_folders.sweep(RESULTS)


# One run per results folder, whatever its working directory (dpmerge/run_lock.py), held until the run ends.
onstart:
    from dpmerge import private_folders, run_lock

    private_folders.close(RESULTS)
    private_folders.close_snakemake_folder()
    run_lock.acquire(RESULTS)


# A dry run also ends in onsuccess; it writes nothing, so it must not create the folders either.
onsuccess:
    if not workflow.dryrun:
        from dpmerge import private_folders

        private_folders.close(RESULTS)


onerror:
    if not workflow.dryrun:
        from dpmerge import private_folders

        private_folders.close(RESULTS)


# The report opens on the study's answer once the run has written it (rule answer), else on the description.
report: os.path.abspath(ANSWER_RST) if os.path.exists(ANSWER_RST) else "workflow/report/workflow.rst"


# Each file below uses only names of the files above it (tests/test_structure.py holds the rules to that).
include: "workflow/rules/noise_common.smk"
include: "workflow/rules/grid.smk"
include: "workflow/rules/merge_common.smk"
include: "workflow/rules/diagnostics_common.smk"
include: "workflow/rules/audit_common.smk"
include: "workflow/rules/mix_common.smk"
include: "workflow/rules/ace_common.smk"
include: "workflow/rules/denoise_common.smk"
include: "workflow/rules/releases_common.smk"
include: "workflow/rules/targets.smk"
include: "workflow/rules/captions.smk"
include: "workflow/rules/finetune.smk"
include: "workflow/rules/audit.smk"
include: "workflow/rules/merge.smk"
include: "workflow/rules/mix.smk"
include: "workflow/rules/noise.smk"
include: "workflow/rules/ace.smk"
include: "workflow/rules/denoise.smk"
include: "workflow/rules/diagnostics.smk"
include: "workflow/rules/paper.smk"


rule all:
    default_target: True
    input:
        all_targets(),
