"""Zero-shot prompt templates for the paper's eight vision tasks.

A CLIP zero-shot head is the mean text embedding of these prompts per class, so results are comparable with the
task-vector literature only if the prompts are the same ones. They are copied verbatim from task_vectors
(mlfoundations/task_vectors, src/datasets/templates.py), which took them from OpenAI CLIP's prompt-engineering
notes (openai/CLIP, data/prompts.md). The class names they are filled with come from
:func:`dpmerge.data.paper.read_split`.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["TEMPLATES", "prompts"]

TEMPLATES: dict[str, list[Callable[[str], str]]] = {
    "sun397": [
        lambda c: f"a photo of a {c}.",
        lambda c: f"a photo of the {c}.",
    ],
    "cars": [
        lambda c: f"a photo of a {c}.",
        lambda c: f"a photo of the {c}.",
        lambda c: f"a photo of my {c}.",
        lambda c: f"i love my {c}!",
        lambda c: f"a photo of my dirty {c}.",
        lambda c: f"a photo of my clean {c}.",
        lambda c: f"a photo of my new {c}.",
        lambda c: f"a photo of my old {c}.",
    ],
    "resisc45": [
        lambda c: f"satellite imagery of {c}.",
        lambda c: f"aerial imagery of {c}.",
        lambda c: f"satellite photo of {c}.",
        lambda c: f"aerial photo of {c}.",
        lambda c: f"satellite view of {c}.",
        lambda c: f"aerial view of {c}.",
        lambda c: f"satellite imagery of a {c}.",
        lambda c: f"aerial imagery of a {c}.",
        lambda c: f"satellite photo of a {c}.",
        lambda c: f"aerial photo of a {c}.",
        lambda c: f"satellite view of a {c}.",
        lambda c: f"aerial view of a {c}.",
        lambda c: f"satellite imagery of the {c}.",
        lambda c: f"aerial imagery of the {c}.",
        lambda c: f"satellite photo of the {c}.",
        lambda c: f"aerial photo of the {c}.",
        lambda c: f"satellite view of the {c}.",
        lambda c: f"aerial view of the {c}.",
    ],
    "eurosat": [
        lambda c: f"a centered satellite photo of {c}.",
        lambda c: f"a centered satellite photo of a {c}.",
        lambda c: f"a centered satellite photo of the {c}.",
    ],
    "svhn": [
        lambda c: f'a photo of the number: "{c}".',
    ],
    "gtsrb": [
        lambda c: f'a zoomed in photo of a "{c}" traffic sign.',
        lambda c: f'a centered photo of a "{c}" traffic sign.',
        lambda c: f'a close up photo of a "{c}" traffic sign.',
    ],
    "mnist": [
        lambda c: f'a photo of the number: "{c}".',
    ],
    "dtd": [
        lambda c: f"a photo of a {c} texture.",
        lambda c: f"a photo of a {c} pattern.",
        lambda c: f"a photo of a {c} thing.",
        lambda c: f"a photo of a {c} object.",
        lambda c: f"a photo of the {c} texture.",
        lambda c: f"a photo of the {c} pattern.",
        lambda c: f"a photo of the {c} thing.",
        lambda c: f"a photo of the {c} object.",
    ],
}


def prompts(task: str, class_name: str) -> list[str]:
    """The prompts whose mean text embedding is `class_name`'s zero-shot weight for `task`."""
    if task not in TEMPLATES:
        raise ValueError(f"no zero-shot templates for task {task!r}; known: {', '.join(TEMPLATES)}")
    return [template(class_name) for template in TEMPLATES[task]]
