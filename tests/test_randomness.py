"""Privacy in fact: every mechanism's randomness is secret (keyed by the study key) and independent of every
other mechanism's, and nothing a release carries lets anyone replay it.

The replay test is the attack an auditor ran on the seeded code: an adversary who knows every training example
but one re-runs the fine-tune on both candidate datasets with the release's own record; with the key the true
candidate reproduces the release bit for bit (the attack has power), without it neither does."""

import hashlib
import json
import math
import multiprocessing
import os
import random
import secrets
import stat
import threading
from dataclasses import asdict

import numpy as np
import pytest
import torch

from conftest import TEST_STUDY_KEY, keyed
from dpmerge.privacy.gaussian_mechanism import poisson_batch
from dpmerge.privacy.randomness import (
    MIN_PIECE,
    NOISE_GENERATORS,
    GeneratorStream,
    MechanismRandomness,
    SecureStream,
    _cpu_generator,
    _cpu_generators,
    _words_generator,
)
from dpmerge.privacy.study_key import (
    StudyKeyError,
    default_key_path,
    derive,
    load_or_create_key,
    mechanism_fingerprint,
    read_key,
)
from dpmerge.training.finetune import FinetuneConfig, finetune_identity, train

# ------------------------------------------------------------------------------------------ the key file


def test_a_new_study_key_is_256_random_bits_readable_only_by_its_owner(tmp_path):
    path = default_key_path(tmp_path / "results")
    key = load_or_create_key(path)
    assert len(key) == 32 and path == tmp_path / "results/private/study.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_or_create_key(path) == key == read_key(path)  # created once, then read
    assert load_or_create_key(tmp_path / "other/study.key") != key  # a new study, a new key
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_a_study_key_others_can_read_or_a_damaged_one_is_refused(tmp_path):
    path = tmp_path / "private/study.key"
    load_or_create_key(path)
    path.chmod(0o644)
    with pytest.raises(StudyKeyError, match=r"readable by others \(mode 0644\).*chmod 600"):
        read_key(path)
    path.chmod(0o600)
    path.write_text("not hex\n")
    with pytest.raises(StudyKeyError, match="is not a study key: expected 64 hexadecimal characters"):
        load_or_create_key(path)


def _create(path):
    return load_or_create_key(path).hex()


@pytest.mark.slow
def test_parallel_jobs_creating_the_key_agree_on_one(tmp_path):
    path = tmp_path / "private/study.key"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        keys = pool.map(_create, [path] * 8)
    assert len(set(keys)) == 1 and keys[0] == read_key(path).hex()


# ----------------------------------------------------------------------------------------- the streams


def test_the_keyed_cpu_generator_is_a_whole_mt19937_state_not_a_32_bit_seed():
    """torch's manual_seed keeps 32 bits of a seed (two seeds 2^32 apart draw the same numbers), so the keyed
    stream writes MT19937's 624 state words itself. Checked against Python's own MT19937 given the same words:
    the layout is right, and every word is secret state."""
    same = [torch.randn(4, generator=torch.Generator().manual_seed(s)) for s in (5, 5 + 2**32)]
    assert torch.equal(*same)  # why manual_seed is not enough
    reference = random.Random(12345)
    version, state, gauss = reference.getstate()
    words = np.array(state[:624], dtype=np.uint64)
    reference.setstate((version, tuple(state[:624]) + (624,), gauss))  # twist before the first output, as torch
    drawn = torch.randint(0, 2**31, (2000,), generator=_words_generator(words)).numpy()
    expected = np.array([reference.getrandbits(32) for _ in range(4000)])[1::2] & 0x7FFFFFFF  # 2 words a draw
    assert np.array_equal(drawn, expected)
    changed = words.copy()
    changed[623] ^= 1
    assert not torch.equal(torch.rand(700, generator=_words_generator(words)),
                           torch.rand(700, generator=_words_generator(changed)))


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_keyed_cpu_noise_is_cut_over_independent_generators_the_same_on_any_thread_count(torch_threads,
                                                                                          monkeypatch):
    """Large draws are spread over NOISE_GENERATORS generators (drawn concurrently); what each piece holds is fixed
    by the material and the draw sizes alone, checked here by drawing each piece by hand from its generator."""
    from dpmerge.privacy import randomness

    material = derive(TEST_STUDY_KEY, {"mechanism": "finetune", "task": "digits"}, "gaussian_noise")
    shapes = [(3, 5), (NOISE_GENERATORS * MIN_PIECE + 7,), (3 * MIN_PIECE,), (2 * MIN_PIECE - 1,)]
    total = sum(math.prod(shape) for shape in shapes)

    # below MIN_CUT_CALL in all (a top's step): nothing is cut, every draw comes from the first generator in order
    monkeypatch.setattr(randomness, "MIN_CUT_CALL", total + 1)
    tensors = [torch.full(shape, 0.5) for shape in shapes]  # what they held is overwritten, never read
    GeneratorStream(*_cpu_generators(material)).normal_(tensors, 2.0)
    first = _cpu_generator(material)
    assert all(torch.equal(t, 2.0 * torch.randn(t.shape, generator=first)) for t in tensors)

    monkeypatch.setattr(randomness, "MIN_CUT_CALL", total)
    added = {}
    for threads in (1, 2, 3):
        torch_threads(threads)
        tensors = [torch.full(shape, 0.5) for shape in shapes]
        GeneratorStream(*_cpu_generators(material)).normal_(tensors, 2.0)
        added[threads] = tensors
    for tensors in added.values():
        assert all(torch.equal(a, b) for a, b in zip(tensors, added[1]))

    generators = _cpu_generators(material)
    assert torch.equal(generators[0].get_state(), _cpu_generator(material).get_state())  # sampler streams unchanged
    # each generator draws, in the tensors' order, its piece of every cut tensor; the first also every small one
    expected = [2.0 * torch.randn((3, 5), generator=generators[0])]
    for count in (NOISE_GENERATORS * MIN_PIECE + 7, 3 * MIN_PIECE):
        cut = min(NOISE_GENERATORS, count // MIN_PIECE)
        sizes = [len(piece) for piece in torch.empty(count).tensor_split(cut)]
        expected.append(2.0 * torch.cat([torch.randn(size, generator=generators[index])
                                         for index, size in enumerate(sizes)]))
    expected.append(2.0 * torch.randn((2 * MIN_PIECE - 1,), generator=generators[0]))  # too small to cut
    assert all(torch.equal(got.reshape(-1), want.reshape(-1)) for got, want in zip(added[1], expected))


def _thread_ids() -> tuple[set[int], set[int]]:
    """The OS thread ids of this process, and those of them Python started."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}, {t.native_id for t in threading.enumerate()}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_cut_noise_starts_no_openmp_team_off_the_main_thread(torch_threads, monkeypatch):
    """A pool thread that runs one parallel torch op gets an OpenMP team of its own that never exits, and past one
    OpenMP thread per core libgomp stops spinning between parallel regions: every later step, private or not, ran
    slower (bench/dp_step.py's non-private baseline with it). The noise pool must only draw (serially), never add."""
    from dpmerge.privacy import randomness

    torch_threads(2)
    monkeypatch.setattr(randomness, "MIN_CUT_CALL", 0)
    monkeypatch.setattr(randomness, "_POOL", None)  # fresh pool threads: none has an OpenMP team yet
    torch.ones(1 << 20).add_(1.0)  # the main thread's own team exists before counting
    before, python_before = _thread_ids()
    tensors = [torch.zeros(NOISE_GENERATORS * MIN_PIECE * 2), torch.zeros(3, 5)]
    stream = MechanismRandomness(TEST_STUDY_KEY, {"mechanism": "finetune"}).stream("gaussian_noise")
    stream.normal_(tensors, 1.0)
    pool = randomness._POOL
    try:
        assert pool is not None and len(pool._threads) >= 1  # the call did hand pieces to the pool
        after, python_after = _thread_ids()
        # New threads Python did not start would be OpenMP workers. Compared by id, not counted: a thread of an
        # earlier test that ends meanwhile (a count once went from 8 to 7) must not hide or fake one.
        assert not after - python_after - before - python_before
        assert all(t.abs().min() > 0 for t in tensors)  # every coordinate got its noise
    finally:
        pool.shutdown()


def test_noise_overwrites_whatever_the_tensors_held_and_normal_is_the_same_draw():
    """normal_ writes std * N(0, I) without reading the tensor (the DP step draws into uninitialised gradient
    tensors, then adds the clipped sums onto them); normal() is that draw into a fresh tensor."""
    for count in (7, 16, 32752 * 2 + 3, 100_003):
        for start in (torch.full((count,), float("nan")), torch.full((count,), 1e30)):
            generator = _cpu_generator(b"c" * 32)
            GeneratorStream(generator).normal_([start], 2.0)
            reference = _cpu_generator(b"c" * 32)
            assert torch.equal(start, 2.0 * torch.randn(count, generator=reference))
            assert torch.equal(generator.get_state(), reference.get_state())
        assert torch.equal(GeneratorStream(_cpu_generator(b"c" * 32)).normal((count,)),
                           torch.randn(count, generator=_cpu_generator(b"c" * 32)))
    secure = SecureStream(b"s" * 32)
    held = torch.full((5, 3), float("nan"))
    secure.normal_([held], 2.0)
    assert torch.equal(held, SecureStream(b"s" * 32).normal((5, 3)) * 2.0)


def test_cut_noise_is_standard_gaussian_with_uncorrelated_pieces_and_resumes_from_its_state(monkeypatch):
    from dpmerge.privacy import randomness

    monkeypatch.setattr(randomness, "MIN_CUT_CALL", 0)
    stream = MechanismRandomness(TEST_STUDY_KEY, {"mechanism": "finetune"}).stream("gaussian_noise")
    assert len(stream.generators) == NOISE_GENERATORS and stream.layout == f"torch-cpux{NOISE_GENERATORS}"
    draw = stream.normal((NOISE_GENERATORS * MIN_PIECE * 4,))
    assert abs(draw.mean().item()) < 0.005 and draw.std().item() == pytest.approx(1.0, abs=0.005)
    assert abs(((draw / draw.std()) ** 4).mean().item() - 3.0) < 0.05
    pieces = draw.view(NOISE_GENERATORS, -1)
    correlations = torch.corrcoef(pieces)
    assert (correlations - torch.eye(NOISE_GENERATORS)).abs().max() < 0.01  # no two generators repeat each other
    state = stream.get_state()
    ahead = stream.normal((3 * MIN_PIECE,))
    stream.set_state(state)
    assert torch.equal(stream.normal((3 * MIN_PIECE,)), ahead)
    with pytest.raises(ValueError, match=f"state of shape \\({NOISE_GENERATORS}, bytes\\)"):
        stream.set_state(_cpu_generator(b"x" * 32).get_state())  # a one-generator state from an older checkpoint


def test_secure_stream_draws_standard_gaussians_and_resumes_from_its_state():
    stream = SecureStream(b"\x01" * 32)
    draws = stream.normal((200_000,), torch.float64)
    assert abs(draws.mean().item()) < 0.01 and draws.std().item() == pytest.approx(1.0, abs=0.01)
    assert abs(((draws / draws.std()) ** 4).mean().item() - 3.0) < 0.1  # Gaussian kurtosis, not just unit std
    uniforms = stream.uniform(100_000)
    assert 0 <= uniforms.min() and uniforms.max() < 1 and uniforms.mean().item() == pytest.approx(0.5, abs=0.01)
    state = stream.get_state()
    ahead = stream.normal((5,))
    stream.set_state(state)
    assert torch.equal(stream.normal((5,)), ahead)
    assert not torch.equal(SecureStream(b"\x02" * 32).normal((5,)), SecureStream(b"\x01" * 32).normal((5,)))


@pytest.mark.parametrize("rng", ["keyed", "secure"])
def test_same_key_and_identity_give_the_same_streams_a_new_key_other_streams(rng):
    identity = {"mechanism": "finetune", "task": "digits"}
    first = MechanismRandomness(TEST_STUDY_KEY, identity, rng).stream("gaussian_noise").normal((64,))
    again = MechanismRandomness(TEST_STUDY_KEY, identity, rng).stream("gaussian_noise").normal((64,))
    other = MechanismRandomness(bytes(32), identity, rng).stream("gaussian_noise").normal((64,))
    assert torch.equal(first, again) and not torch.equal(first, other)


BASE = FinetuneConfig(method="dp_merging", target_epsilon=4.0, epochs=1.0, batch_size=8, lr=1e-2, seed=0)
NAMES = {"backbone": "effnet", "task": "digits", "method": "dp_merging"}


def _variants():
    """Mechanisms that differ from the base fine-tune in exactly one thing."""
    from dataclasses import replace

    yield "task", finetune_identity(BASE, {**NAMES, "task": "mnist1d"}, "w0")
    yield "epsilon", finetune_identity(replace(BASE, target_epsilon=8.0), NAMES, "w0")
    yield "method label", finetune_identity(replace(BASE, method="dp_sam"), {**NAMES, "method": "dp_sam"}, "w0")
    yield "sweep value", finetune_identity(replace(BASE, rho=0.2), {**NAMES, "method": "dp_merging-rho0.2"}, "w0")
    yield "seed", finetune_identity(replace(BASE, seed=1), NAMES, "w0")
    yield "backbone", finetune_identity(BASE, {**NAMES, "backbone": "minilm"}, "w0")
    yield "pretrained weights", finetune_identity(BASE, NAMES, "other-w0")
    yield "learning rate", finetune_identity(replace(BASE, lr=2e-2), NAMES, "w0")


def _draws(identity, rng="keyed"):
    randomness = MechanismRandomness(TEST_STUDY_KEY, identity, rng)
    batch = poisson_batch(1000, 0.05, randomness.stream("poisson_sampler"))
    return batch, randomness.stream("gaussian_noise").normal((256,))


@pytest.mark.parametrize("rng", ["keyed", "secure"])
def test_mechanisms_differing_in_any_one_setting_draw_different_batches_and_noise(rng):
    base_batch, base_noise = _draws(finetune_identity(BASE, NAMES, "w0"), rng)
    seen = {"base": base_noise}
    for what, identity in _variants():
        batch, noise = _draws(identity, rng)
        assert not torch.equal(batch, base_batch), what
        assert not torch.equal(noise, base_noise), what
        # not the same stream shifted either: correlation of independent draws is small
        assert abs(torch.corrcoef(torch.stack([noise, base_noise]))[0, 1]) < 0.3, what
        seen[what] = noise
    assert len({tuple(v.tolist()) for v in seen.values()}) == len(seen)


def test_a_private_statistic_draws_apart_from_its_fine_tune_and_from_another_kind():
    from dpmerge.privacy.statistics import statistic_identity

    meta = {"backbone": "effnet", "task": "digits", "method": "naive_dp", "rho": 0.0, "anchor_lambda": 0.0,
            "target_epsilon": 4.0, "seed": 0}
    settings = {"examples": 256, "clip_norm": 0.05, "epsilon": 1.0}
    streams = {kind: _draws(statistic_identity(kind, meta, "abc", settings)) for kind in ("gram", "fisher")}
    for method in ("dp_merging", "dp_sam"):  # the same task's statistics for two methods: independent noise
        streams[method] = _draws(statistic_identity("fisher", {**meta, "method": method}, "abc", settings))
    streams["finetune"] = _draws(finetune_identity(BASE, NAMES, "w0"))
    noises = [noise for _, noise in streams.values()]
    assert all(not torch.equal(a, b) for i, a in enumerate(noises) for b in noises[i + 1:])


# ---------------------------------------------------------------------------- releases and their replay


def fresh_key():
    return secrets.token_bytes(32)


def run(backbone, features, labels, config=BASE, **randomness):
    return train(backbone, 3, features, labels, config, **(randomness or keyed()), log=lambda _: None)


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_same_key_reproduces_a_release_and_a_new_key_gives_another(toy_backbone, toy_data):
    features, labels = toy_data
    first = run(toy_backbone, features, labels)
    assert same(run(toy_backbone, features, labels).task_vector, first.task_vector)
    fresh = run(toy_backbone, features, labels, **keyed(study_key=fresh_key()))
    assert not same(fresh.task_vector, first.task_vector)
    assert fresh.record == first.record  # the records cannot tell the two studies apart


@pytest.mark.slow
def test_two_tasks_with_the_same_data_size_no_longer_share_batches_or_noise(toy_backbone, toy_data):
    """digits and mnist1d (same N, same classes) got identical batches and noise from a shared seed."""
    features, labels = toy_data
    digits = run(toy_backbone, features, labels, **keyed(task="digits"))
    mnist1d = run(toy_backbone, features, labels, **keyed(task="mnist1d"))
    assert not same(digits.task_vector, mnist1d.task_vector)


@pytest.mark.slow
def test_a_release_cannot_be_replayed_from_what_it_carries(toy_backbone, toy_data):
    """Neighbouring datasets D and D' (one example removed). The adversary knows both, the released task vector
    and its record. Replaying both candidates with every key a record could suggest reproduces nothing; only the
    study's secret key would (and then exposes membership: the test has power)."""
    features, labels = toy_data
    neighbour = (tuple(f[1:] for f in features), labels[1:])
    study_key = fresh_key()
    released = run(toy_backbone, features, labels, **keyed(study_key=study_key))
    record = released.record
    config = FinetuneConfig(**{k: v for k, v in record["hyperparameters"].items()
                               if k in asdict(BASE) and k not in ("per_sample_gradients",)})
    # nothing secret in the record: not the key, not a derived seed, not the checkpoint fingerprint
    text = json.dumps(record)
    identity = finetune_identity(config, {"backbone": "toy", "task": "toy"}, toy_backbone.checkpoint_sha256)
    for secret in (study_key.hex(), derive(study_key, identity, "gaussian_noise").hex(),
                   mechanism_fingerprint(study_key, identity)):
        assert secret not in text
    assert record["randomness"] == "keyed" and record["seed"] == 0
    seed = record["seed"]
    guesses = [bytes(32), TEST_STUDY_KEY, hashlib.sha256(str(seed).encode()).digest(),
               seed.to_bytes(32, "little"), fresh_key()]
    for guess in guesses:
        for candidate in ((features, labels), neighbour):
            replay = run(toy_backbone, *candidate, config, **keyed(study_key=guess))
            assert not same(replay.task_vector, released.task_vector)
    # the attack the seeded code allowed, with the key: the true dataset replays exactly, the neighbour not
    assert same(run(toy_backbone, features, labels, config, **keyed(study_key=study_key)).task_vector,
                released.task_vector)
    assert not same(run(toy_backbone, *neighbour, config, **keyed(study_key=study_key)).task_vector,
                    released.task_vector)


@pytest.mark.slow
def test_keyed_and_secure_generators_give_different_releases(toy_backbone, toy_data):
    from dataclasses import replace

    features, labels = toy_data
    keyed_release = run(toy_backbone, features, labels, replace(BASE, rng="keyed"))
    secure_release = run(toy_backbone, features, labels, replace(BASE, rng="secure"))
    assert secure_release.record["randomness"] == "secure"
    assert not same(keyed_release.task_vector, secure_release.task_vector)
    assert same(run(toy_backbone, features, labels, replace(BASE, rng="secure")).task_vector,
                secure_release.task_vector)
