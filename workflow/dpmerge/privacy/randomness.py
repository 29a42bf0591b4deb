"""Random streams of the randomized mechanisms, derived from the study's secret key (privacy/study_key.py).

A mechanism (one fine-tune, one private merge statistic) asks `MechanismRandomness(key, identity, rng)` for
named streams ("poisson_sampler", "gaussian_noise", ...); each stream's secret material is
HMAC-SHA256(key, identity, name). Two generators (config `privacy.rng`):

- ``keyed`` (default): torch's own generators, with their whole state derived from the key, so they cost what
  torch's generators cost. torch's CPU generator is an MT19937 whose `manual_seed` keeps only 32 bits of any seed
  (2^32 candidate seeds could be tried one by one), so its 624-word state is written directly from
  SHAKE-256(material): 19,968 secret bits. A CUDA generator (Philox) takes a 64-bit seed. Neither generator is
  cryptographically secure (about 624 consecutive raw outputs of an MT19937 determine the rest), but no raw output
  is ever released, only noisy clipped sums of them. On the CPU a stream holds NOISE_GENERATORS such generators
  (the first from the material, the others from the material and their index), and long Gaussian draws are cut
  into that many pieces drawn concurrently, one generator each: an MT19937 fills ~200M normals a second, which at
  ViT scale was two thirds of the DP step's overhead. The cut depends only on the draws' sizes, so the draws do not
  depend on the thread count; uniforms and every draw too small to cut (a head's whole step) come from the first
  generator alone, as they did before the split.
- ``secure``: every draw comes from SHAKE-256 (FIPS 202) in counter mode under the material, a cryptographically
  secure generator. Uniforms have 53 random bits; Gaussians come from Box-Muller, and each noise coordinate is the
  sum of four such draws halved, which is how Opacus's secure_mode defends against floating-point attacks on
  the Gaussian sampler (Holohan & Braghin, "Secure Random Sampling in Differential Privacy", arXiv 2107.10138,
  Sec. 5.1). Drawn on the CPU and copied to the device; bench/dp_step.py measures its cost.

Every stream has `get_state` / `set_state`, so a checkpointed run resumes bit-identically.
"""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from dpmerge.privacy.study_key import derive

RNG_MODES = ("keyed", "secure")

# torch's CPU generator state (CPUGeneratorImplState, ATen/CPUGeneratorImpl.cpp): the_initial_seed (u64), left
# (i32), seeded (i32), next (u64), then MT19937's 624 state words (one u32 each, stored as u64), then the cached
# normal draws. tests/test_randomness.py checks this layout against Python's own MT19937.
_MT_WORDS = 624
_MT_STATE_OFFSET = 24
_CPU_STATE_BYTES = 5056


def _words_generator(words: np.ndarray) -> torch.Generator:
    """A torch CPU generator whose MT19937 state is exactly these 624 32-bit words (twisted before the first
    draw, as after manual_seed)."""
    template = torch.Generator().manual_seed(0).get_state()
    if template.numel() != _CPU_STATE_BYTES:
        raise RuntimeError(f"torch {torch.__version__}: CPU generator state is {template.numel()} bytes, expected "
                           f"{_CPU_STATE_BYTES}; dpmerge.privacy.randomness must learn this torch's layout")
    if len(words) != _MT_WORDS or not np.any(words):  # all-zero is the one state an MT19937 cannot leave
        raise ValueError(f"an MT19937 state is {_MT_WORDS} words, not all zero")
    state = template.numpy().copy()
    state[_MT_STATE_OFFSET:_MT_STATE_OFFSET + 8 * _MT_WORDS] = np.asarray(words, dtype="<u8").view(np.uint8)
    state[:8] = 0  # the_initial_seed: no seed stands behind this state
    generator = torch.Generator()
    generator.set_state(torch.from_numpy(state))
    return generator


NOISE_GENERATORS = 4  # fixed, never the thread count: the draws must not depend on the machine
MIN_PIECE = 1 << 16  # below this many coordinates per piece, handing a piece to a thread costs more than it saves
# Below this many coordinates in one normal_ call nothing is cut: handing pieces to the pool costs more than
# a small draw (a head's) takes. The embedded tops' steps (1.0M and 1.8M coordinates) are cut. That gains only
# while torch's idle OpenMP worker lets the second core go soon after the op before the draw, which `dpmerge` arranges
# (openmp_wait.py); under libgomp's default spinning the pool thread drew beside a spinning worker and the cut
# top was no faster (MiniLM top at 2^20: 1.38 and 1.36 x non-private against 1.34, 1.28 and 1.33 uncut).
MIN_CUT_CALL = 1 << 19


def _cpu_generator(material: bytes) -> torch.Generator:
    return _words_generator(np.frombuffer(hashlib.shake_256(material).digest(4 * _MT_WORDS), dtype="<u4"))


def _cpu_generators(material: bytes) -> list[torch.Generator]:
    # material is a fixed-length HMAC output, so material || index never collides with another stream's input
    return [_cpu_generator(material + (b"" if index == 0 else index.to_bytes(4, "little")))
            for index in range(NOISE_GENERATORS)]


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=NOISE_GENERATORS, thread_name_prefix="dpmerge-noise")
    return _POOL


class GeneratorStream:
    """Draws from torch generators (the `keyed` mode, or plain seeded generators in tests). With more than one
    generator, normal_ cuts a large tensor's n coordinates into min(generators, n // MIN_PIECE) contiguous
    pieces, piece j from generator j, drawn on up to torch.get_num_threads() threads at once (torch releases the
    GIL while it fills a tensor). Each generator's sequence of draws is the same on any number of threads."""

    def __init__(self, generator: torch.Generator, *more: torch.Generator):
        self.generators = [generator, *more]

    @property
    def generator(self) -> torch.Generator:
        """The first generator: uniforms and every draw not cut come from it."""
        return self.generators[0]

    def uniform(self, count: int) -> torch.Tensor:
        """`count` uniforms in [0, 1), float32, on the generator's device."""
        return torch.rand(count, generator=self.generator, device=self.generator.device)

    def normal(self, shape, dtype=torch.float32, device=None) -> torch.Tensor:
        draw = torch.empty(shape, dtype=dtype, device=self.generator.device)
        self.normal_([draw], 1.0)
        return draw

    def normal_(self, tensors: list[torch.Tensor], std: float) -> None:
        """Overwrite each tensor with std * N(0, I), its old values unread. Each generator draws in the tensors'
        order: the first for every tensor not cut, and piece j of each cut tensor comes from generator j. Cut are
        the contiguous tensors of at least 2 * MIN_PIECE coordinates, when the call fills at least MIN_CUT_CALL
        coordinates in all.

        Each piece is one normal_ call straight into the tensor, with no temporary: the caller draws the noise
        first and adds the data's terms onto it (training/dp_step.privatized_gradient), so the noise costs no
        pass of its own over the gradient. Nothing but normal_ runs on the pool's threads, and torch draws
        normals serially, outside any OpenMP region: a parallel op there (an add over more than ATen's grain of
        32768 coordinates) would start an OpenMP team for that thread, whose threads never exit, and with more
        OpenMP threads than cores libgomp stops spinning between parallel regions, which made every later step
        slower, private or not (MiniLM top 28.5 -> 37.2 ms a non-private step, ViT-B/32 1.82 -> 1.86 s)."""
        pieces = [[] for _ in self.generators]  # per generator, what it draws into, in the tensors' order
        cutting = sum(tensor.numel() for tensor in tensors) >= MIN_CUT_CALL
        for tensor in tensors:
            cut = min(len(self.generators), tensor.numel() // MIN_PIECE) if cutting else 1
            if cut < 2 or not tensor.is_contiguous():
                pieces[0].append(tensor)
                continue
            for index, piece in enumerate(tensor.view(-1).tensor_split(cut)):
                pieces[index].append(piece)

        used = [index for index, assigned in enumerate(pieces) if assigned]
        workers = min(len(used), torch.get_num_threads())

        def fill_share(worker: int) -> None:  # generators dealt round-robin: each is only ever used by one worker
            for index in used[worker::workers]:
                for piece in pieces[index]:
                    piece.normal_(0.0, std, generator=self.generators[index])

        # The calling thread takes the first share (generator 0, with every tensor not cut) and the pool the rest.
        helpers = [_pool().submit(fill_share, worker) for worker in range(1, workers)]
        fill_share(0)
        for helper in helpers:
            helper.result()

    def get_state(self):
        if len(self.generators) == 1:
            return self.generator.get_state()
        return torch.stack([generator.get_state() for generator in self.generators])

    def set_state(self, state) -> None:
        if len(self.generators) == 1:
            self.generator.set_state(state)
            return
        if state.dim() != 2 or state.shape[0] != len(self.generators):
            raise ValueError(f"a random stream of {len(self.generators)} generators needs a state of shape "
                             f"({len(self.generators)}, bytes), got {tuple(state.shape)}")
        for generator, row in zip(self.generators, state):
            generator.set_state(row.clone())  # a row view is refused as an invalid state: give it its own storage

    @property
    def layout(self) -> str:
        return f"torch-{self.generator.device.type}x{len(self.generators)}"


class SecureStream:
    """SHAKE-256 in counter mode: block i of the stream is SHAKE-256(material | i), as long as the draw needs."""

    def __init__(self, material: bytes):
        self._material = material
        self._counter = 0

    def _unit_interval(self, count: int) -> torch.Tensor:
        """`count` uniforms in (0, 1] with 53 random bits each (never 0, so log(u) is finite), float64, from one
        fresh SHAKE-256 output."""
        block = hashlib.shake_256(self._material + self._counter.to_bytes(8, "little")).digest(8 * count)
        self._counter += 1
        words = torch.frombuffer(bytearray(block), dtype=torch.int64)  # bit patterns; the top 53 bits are used
        return (torch.bitwise_right_shift(words, 11) & ((1 << 53) - 1)).to(torch.float64).add_(1.0).mul_(2.0**-53)

    def uniform(self, count: int) -> torch.Tensor:
        return (1.0 - self._unit_interval(count)).to(torch.float32)  # [0, 1)

    def normal(self, shape, dtype=torch.float32, device=None) -> torch.Tensor:
        """N(0, 1) per coordinate: four Box-Muller draws summed and halved (Opacus's secure_mode)."""
        count = math.prod(shape)
        pairs = (count + 1) // 2
        u = self._unit_interval(8 * pairs).view(4, 2, pairs)
        radius = torch.sqrt(u[:, 0].log_().mul_(-2.0))
        angle = u[:, 1].mul_(2.0 * math.pi)
        draws = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)[:, :count]
        return (draws.sum(0) / 2.0).reshape(tuple(shape)).to(dtype=dtype, device=device)

    def normal_(self, tensors: list[torch.Tensor], std: float) -> None:
        for tensor in tensors:
            tensor.copy_(self.normal(tensor.shape, tensor.dtype, tensor.device)).mul_(std)

    layout = "shake256"

    def get_state(self):
        return torch.tensor(self._counter, dtype=torch.int64)

    def set_state(self, state) -> None:
        self._counter = int(state)


class MechanismRandomness:
    """The secret streams of one mechanism: its identity (every setting that makes it this mechanism and not
    another) and the study key determine them; nothing in a release does."""

    def __init__(self, key: bytes, identity: dict, rng: str = "keyed"):
        if rng not in RNG_MODES:
            raise ValueError(f"privacy.rng must be one of {', '.join(RNG_MODES)}, got {rng!r}")
        self._key, self.identity, self.rng = key, dict(identity), rng

    def material(self, stream: str) -> bytes:
        return derive(self._key, self.identity, stream)

    def stream(self, name: str, device: str | torch.device = "cpu"):
        material = self.material(name)
        if self.rng == "secure":
            return SecureStream(material)
        device = torch.device(device)
        if device.type == "cpu":
            return GeneratorStream(*_cpu_generators(material))
        generator = torch.Generator(device=device)
        generator.manual_seed(int.from_bytes(material[:8], "little"))  # Philox: all 64 bits are used
        return GeneratorStream(generator)

    def seed(self, name: str) -> int:
        """A 63-bit integer seed for what takes only an integer (e.g. torch.manual_seed for a head's initial
        weights, which need no secrecy: DP holds for any public initialisation)."""
        return int.from_bytes(self.material(name)[:8], "little") >> 1
