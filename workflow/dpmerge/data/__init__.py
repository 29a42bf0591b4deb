"""Tasks: the task registry, the embedded datasets, the paper's dataset readers and their stand-ins.

From the bottom up: registry.py (every task's TaskSpec, torch- and numpy-free), fixed_split.py (what a builder
returns), the embedded builders embedded.py, patches.py and bbc.py, the paper's readers paper_split.py,
paper_vision.py, paper_glue.py and paper.py (read_split, download), standins.py (stand-in copies of the paper's
datasets), and loading.py (load_task, on top of both).
"""
