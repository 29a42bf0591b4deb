# The diagnostics' input functions (rules in workflow/rules/diagnostics.smk): the merged model each
# diagnostic reads.


def interpolation_merged_model(wildcards):
    return MERGED.format(operator=config["diagnostics"]["interpolation"]["operator"], **wildcards)


def curvature_merged_model(wildcards):
    return MERGED.format(operator=config["diagnostics"]["curvature"]["operator"], **wildcards)


def landscape_merged_model(wildcards):
    return MERGED.format(operator=config["diagnostics"]["landscape"]["operator"], **wildcards)
