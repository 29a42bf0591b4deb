"""2-D loss landscapes (paper App. B.4, Figs. 4, 5): exact on quadratics, where the loss on a plane is a known
quadratic polynomial in (a, b); filter-normalised directions (Li et al. 2018); the task-vector plane; the
`dpmerge landscape` and `plot-landscape` commands on a toy backbone."""

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import build_backbones_with, flat, unflat
from dpmerge import cli
from dpmerge.artifacts import PRIVACY_FIELDS, load_tensors, save_released, save_tensors, tensors_sha256
from dpmerge.diagnostics.landscape import filter_normalized_direction, loss_landscape, task_vector_plane
from dpmerge.models.evaluation import evaluate_head
from dpmerge.report.figures import plot_landscape


def random_vector(seed):
    return torch.randn(7, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def quadratic(seed):
    """L(w) = 1/2 (w - m)^T A (w - m) + c with A symmetric positive semi-definite."""
    root = torch.randn(7, 7, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    hessian, minimum, offset = root @ root.T, random_vector(seed + 100), 0.1 * seed

    def loss(params):
        difference = flat(params) - minimum
        return 0.5 * difference @ hessian @ difference + offset

    return loss, hessian, minimum, offset


A_GRID, B_GRID = [-1.0, 0.0, 0.5, 2.0], [-0.5, 0.0, 1.0]


def test_landscape_of_quadratics_is_their_closed_form_and_mean_is_the_task_average():
    tasks = {"first": quadratic(1), "second": quadratic(2)}
    centre, d1, d2 = random_vector(3), random_vector(4), random_vector(5)
    rows = loss_landscape({name: t[0] for name, t in tasks.items()}, unflat(centre), unflat(d1), unflat(d2),
                          A_GRID, B_GRID)
    expected_order = [(a, b, task) for a in A_GRID for b in B_GRID for task in ("first", "second", "mean")]
    assert [(r["a"], r["b"], r["task"]) for r in rows] == expected_order
    by_point = {(r["a"], r["b"], r["task"]): r["loss"] for r in rows}
    for a in A_GRID:
        for b in B_GRID:
            closed = {}
            for name, (_, hessian, minimum, offset) in tasks.items():
                # L(c + a d1 + b d2) = L(c) + g.(a d1 + b d2) + 1/2 (a d1 + b d2)^T A (a d1 + b d2), g = A (c - m)
                at_centre = 0.5 * (centre - minimum) @ hessian @ (centre - minimum) + offset
                gradient = hessian @ (centre - minimum)
                closed[name] = float(at_centre + a * gradient @ d1 + b * gradient @ d2 + 0.5 * (
                    a * a * d1 @ hessian @ d1 + 2 * a * b * d1 @ hessian @ d2 + b * b * d2 @ hessian @ d2))
                assert by_point[(a, b, name)] == pytest.approx(closed[name], rel=1e-10)
            assert by_point[(a, b, "mean")] == pytest.approx((closed["first"] + closed["second"]) / 2, rel=1e-10)


def test_landscape_of_a_constant_loss_or_between_identical_models_is_flat():
    constant = loss_landscape({"t": lambda params: torch.tensor(0.7, dtype=torch.float64)}, unflat(random_vector(1)),
                              unflat(random_vector(2)), unflat(random_vector(3)), A_GRID, B_GRID)
    assert {row["loss"] for row in constant} == {0.7}
    # every task model equal to w0: both task vectors vanish and the whole plane is the merged model
    loss, *_ = quadratic(4)
    zero = unflat(torch.zeros(7, dtype=torch.float64))
    centre = unflat(random_vector(5))
    rows = loss_landscape({"t": loss}, centre, *task_vector_plane(zero, zero), A_GRID, B_GRID)
    assert {row["loss"] for row in rows} == {float(loss(centre))}


def test_task_vector_plane_points_are_the_merge_plus_task_vectors():
    w0, tau_a, tau_b = random_vector(1), random_vector(2), random_vector(3)
    scaling = 0.3
    merged = w0 + scaling * (tau_a + tau_b)  # task arithmetic of two tasks
    d1, d2 = task_vector_plane(unflat(tau_a), unflat(tau_b))
    seen = {}

    def recording_loss(params):
        seen[len(seen)] = flat(params)
        return torch.tensor(0.0)

    coordinates = [-scaling, 0.0, 1.0 - scaling, 1.0]
    loss_landscape({"t": recording_loss}, unflat(merged), d1, d2, coordinates, coordinates)
    point = {(a, b): seen[i * len(coordinates) + j] for i, a in enumerate(coordinates)
             for j, b in enumerate(coordinates)}
    assert torch.equal(point[(0.0, 0.0)], merged)
    assert torch.allclose(point[(1.0, 0.0)], merged + tau_a, atol=1e-12)
    assert torch.allclose(point[(0.0, 1.0)], merged + tau_b, atol=1e-12)
    assert torch.allclose(point[(-scaling, -scaling)], w0, atol=1e-12)  # the pretrained model
    assert torch.allclose(point[(1.0 - scaling, -scaling)], w0 + tau_a, atol=1e-12)  # task a's own model
    with pytest.raises(ValueError, match="differ in tensors"):
        task_vector_plane(unflat(tau_a), {"layer.weight": tau_b[:4].reshape(2, 2)})


def test_filter_normalized_direction_matches_filter_norms_and_leaves_biases_and_norms(toy_backbone):
    params = toy_backbone.top_state()
    params["0.weight"][1] = 0.0  # a dead filter stays dead instead of becoming NaN
    direction = filter_normalized_direction(params, seed=3)
    assert list(direction) == list(params)
    assert {name for name, value in params.items() if value.ndim >= 2} == {"0.weight", "3.weight"}
    for name, value in params.items():
        assert direction[name].shape == value.shape and direction[name].dtype == value.dtype
        if value.ndim <= 1:  # conv and linear biases, layer-norm scale and shift
            assert torch.equal(direction[name], torch.zeros_like(value)), name
        else:
            assert torch.allclose(direction[name].flatten(1).norm(dim=1), value.flatten(1).norm(dim=1),
                                  rtol=1e-5, atol=0), name
            assert not torch.allclose(direction[name], value), name  # a random direction, not the weights
    assert torch.equal(direction["0.weight"][1], torch.zeros_like(direction["0.weight"][1]))
    again = filter_normalized_direction(dict(reversed(list(params.items()))), seed=3)
    assert all(torch.equal(again[name], direction[name]) for name in params)  # same seed, any dict order
    other = filter_normalized_direction(params, seed=4)
    assert not torch.allclose(other["3.weight"], direction["3.weight"])


def test_loss_landscape_refuses_a_task_named_mean_and_foreign_directions():
    loss, *_ = quadratic(1)
    params = unflat(random_vector(1))
    with pytest.raises(ValueError, match="named 'mean'"):
        loss_landscape({"mean": loss}, params, params, params, [0.0], [0.0])
    with pytest.raises(ValueError, match="direction d2 has other tensors"):
        loss_landscape({"t": loss}, params, params, {"layer.weight": params["layer.weight"]}, [0.0], [0.0])


# ---------------------------------------------------------------------------------------------- command line


def record(task):
    meta = {field: 0 for field in PRIVACY_FIELDS}
    meta.update(method="naive_dp", target_epsilon=4.0, spent_epsilon=3.9, delta=1e-3, seed=0,
                pretrained_sha256="abc", accountant="rdp", sampling="poisson", backbone="toy", task=task)
    return meta


@pytest.fixture
def merged_toy(tmp_path, toy_backbone, toy_data, monkeypatch):
    """w0, two released task vectors and heads, prepared test data and their task-arithmetic merge."""
    # the stages build their backbone through models.spec, looked up when they run
    build_backbones_with(monkeypatch, lambda spec: toy_backbone)
    features, labels = toy_data
    base = toy_backbone.top_state()
    save_tensors(tmp_path / "w0.safetensors", base, {"pretrained_sha256": "abc"})
    w0_sha256 = tensors_sha256(base)
    generator = torch.Generator().manual_seed(11)
    vectors, files = [], {"task-vectors": [], "heads": [], "data": []}
    for index, task in enumerate(("alpha", "beta")):
        vector = {name: 0.1 * torch.randn(value.shape, generator=generator) for name, value in base.items()}
        head = {"weight": torch.randn(3, 6, generator=generator), "bias": torch.zeros(3)}
        save_released(tmp_path / f"{task}.tv.safetensors", vector, {**record(task), "w0_sha256": w0_sha256})
        save_tensors(tmp_path / f"{task}.head.safetensors", head, record(task))
        torch.save({"task": task, "task_spec": {"metric": "accuracy", "num_classes": 3},
                    "test_features": [f[index::2] for f in features], "test_labels": labels[index::2]},
                   tmp_path / f"{task}.pt")
        vectors.append(vector)
        for flag, suffix in (("task-vectors", "tv.safetensors"), ("heads", "head.safetensors"), ("data", "pt")):
            files[flag].append(str(tmp_path / f"{task}.{suffix}"))
    merged = {name: base[name] + 0.5 * (vectors[0][name] + vectors[1][name]) for name in base}
    save_tensors(tmp_path / "merged.safetensors", merged, {"operator": "task_arithmetic",
                                                           "merge_name": "task_arithmetic",
                                                           "base": {"sha256": w0_sha256}})
    args = ["--backbone-spec", '{"kind": "toy"}', "--base", str(tmp_path / "w0.safetensors"),
            "--merged", str(tmp_path / "merged.safetensors")]
    for flag, paths in files.items():
        args += [f"--{flag}", *paths]
    return tmp_path, args, base, vectors, merged, toy_backbone, features, labels


@pytest.mark.slow
def test_landscape_command_on_both_planes_then_plot(merged_toy, capsys):
    folder, args, base, vectors, merged, backbone, features, labels = merged_toy
    cli.main(["landscape", *args, "--plane", "task_vectors", "--points", "3", "--span", "0.5",
              "--max-examples", "16", "-o", str(folder / "tv.parquet")])
    assert capsys.readouterr().out.count("[landscape] a = ") == 3  # one progress line per grid row
    frame = pd.read_parquet(folder / "tv.parquet")
    assert len(frame) == 3 * 3 * 3 and list(dict.fromkeys(frame["task"])) == ["alpha", "beta", "mean"]
    assert set(frame["operator"]) == {"task_arithmetic"} and set(frame["method"]) == {"naive_dp"}
    assert (frame["direction_1"] == "alpha").all() and (frame["direction_2"] == "beta").all()
    assert set(frame.loc[frame["task"] != "mean", "num_examples"]) == {16}
    loss = frame.set_index(["a", "b", "task"])["loss"]
    # (0, 0) is the merged model and (-1/2, -1/2) is w0, the two halves of the task-arithmetic scaling undone;
    # each task is scored with its own head on the same seeded subsample of 16 as every diagnostic
    pick = torch.randperm(32, generator=torch.Generator().manual_seed(0))[:16]
    for (a, b), state in (((0.0, 0.0), merged), ((-0.5, -0.5), base)):
        backbone.load_top_state(state)
        for index, task in enumerate(("alpha", "beta")):
            head, _ = load_tensors(folder / f"{task}.head.safetensors")
            subsample = tuple(f[index::2][pick] for f in features)
            expected = evaluate_head(backbone, head, subsample, labels[index::2][pick], "accuracy")["loss"]
            assert loss[(a, b, task)] == pytest.approx(expected, rel=1e-5)
        assert loss[(a, b, "mean")] == pytest.approx((loss[(a, b, "alpha")] + loss[(a, b, "beta")]) / 2)

    cli.main(["landscape", *args, "--points", "3", "--max-examples", "8", "--seed", "5",
              "-o", str(folder / "random.parquet")])
    random_plane = pd.read_parquet(folder / "random.parquet")
    assert set(random_plane["direction_1"]) == {"random (seed 5)"} and set(random_plane["plane"]) == {"random"}
    centre = random_plane.set_index(["a", "b", "task"])["loss"]
    assert centre[(0.0, 0.0, "mean")] != centre[(1.0, 1.0, "mean")]

    outputs = [folder / "landscape.png", folder / "landscape.pdf"]
    cli.main(["plot-landscape", str(folder / "tv.parquet"), str(folder / "random.parquet"), "--title", "toy",
              "-o", *map(str, outputs)])
    assert all(path.stat().st_size > 0 for path in outputs)


@pytest.mark.parametrize("flags,message", [
    (["--points", "2"], "--points must be >= 3"),
    (["--span", "0"], "--span must be a finite number > 0"),
    (["--span", "nan"], "--span must be a finite number > 0"),
    (["--max-examples", "0"], "--max-examples must be >= 1"),
])
def test_landscape_command_names_the_bad_flag(merged_toy, flags, message):
    folder, args, *_ = merged_toy
    with pytest.raises(SystemExit, match=message):
        cli.main(["landscape", *args, *flags, "-o", str(folder / "x.parquet")])
    assert not (folder / "x.parquet").exists()


def test_task_vector_plane_needs_two_task_vectors(merged_toy):
    folder, args, *_ = merged_toy
    one_vector = args[:args.index("--task-vectors") + 2] + args[args.index("--heads"):]
    with pytest.raises(SystemExit, match="--plane task_vectors needs at least two --task-vectors"):
        cli.main(["landscape", *one_vector, "--plane", "task_vectors", "-o", str(folder / "x.parquet")])


@pytest.mark.slow
def test_plot_landscape_writes_png_and_pdf_for_two_methods(tmp_path):
    grid = np.linspace(-1.0, 1.0, 5)
    frames = []
    for method, curvature in (("naive_dp", 3.0), ("dp_merging", 1.0)):  # DP-Merging: the wider basin
        rows = [{"a": a, "b": b, "task": task, "loss": curvature * (a * a + 0.5 * b * b) + 0.2 + shift,
                 "method": method, "operator": "task_arithmetic", "plane": "random", "backbone": "vit_b32",
                 "target_epsilon": "4.0"}
                for a in grid for b in grid for task, shift in (("t1", 0.0), ("t2", 0.2), ("mean", 0.1))]
        frames.append(pd.DataFrame(rows))
    for suffix in ("png", "pdf"):
        out = tmp_path / f"landscape.{suffix}"
        plot_landscape(frames, out, "Loss landscapes, eps = 4")
        assert out.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["landscape.pdf", "landscape.png"]


def _command_args(command, folder, args):
    """The fixture's flags as `command` takes them: evaluate scores the merged model or the vectors, never both."""
    flags, current = {}, None
    for item in args:
        if item.startswith("--"):
            current = item
            flags[current] = []
        else:
            flags[current].append(item)
    keep = {"drift": ["--base", "--task-vectors"],
            "evaluate-merged": ["--backbone-spec", "--base", "--merged", "--heads", "--data"],
            "evaluate-individual": ["--backbone-spec", "--base", "--task-vectors", "--heads", "--data"]}
    keep["statistics"] = ["--backbone-spec", "--base", "--task-vectors", "--heads", "--data"]
    chosen = keep.get(command, list(flags))
    out = [command.split("-")[0]]
    if command == "statistics":
        out += ["--kind", "gram", "--source", "public", "--public-data", flags["--data"][0]]
    for flag in chosen:
        out += [flag, *flags[flag]]
    return out + ["-o", str(folder / f"{command}.parquet")]


@pytest.mark.parametrize("command,message", [
    ("drift", "is not the w0 .* was trained from"),
    ("evaluate-individual", "is not the w0 .* was trained from"),
    ("evaluate-merged", "was merged on another base than"),
    ("interpolate", "is not the w0 .* was trained from"),
    ("curvature", "is not the w0 .* was trained from"),
    ("landscape", "was merged on another base than"),
    ("statistics", "is not the w0 .* was trained from"),
])
def test_evaluation_and_diagnostics_refuse_a_base_that_is_not_the_w0_of_their_inputs(merged_toy, command, message):
    folder, args, base, *_ = merged_toy
    # the same label and structure as the real w0, other weights: only the content hash can tell
    forged = {name: value + 1e-3 for name, value in base.items()}
    save_tensors(folder / "w0.safetensors", forged, {"pretrained_sha256": "abc"})
    with pytest.raises(SystemExit, match=message):
        cli.main(_command_args(command, folder, args))
    assert not (folder / f"{command}.parquet").exists()


def test_a_base_holding_nan_is_refused_before_anything_is_scored(merged_toy):
    folder, args, base, *_ = merged_toy
    poisoned = dict(base)
    name = next(iter(poisoned))
    poisoned[name] = poisoned[name].clone().view(-1)
    poisoned[name][0] = float("nan")
    save_tensors(folder / "w0.safetensors", {**base, name: poisoned[name].view(base[name].shape)},
                 {"pretrained_sha256": "abc"})
    with pytest.raises(SystemExit, match=f"tensor '{name}' contains NaN or Inf"):
        cli.main(_command_args("evaluate-merged", folder, args))


def test_the_real_w0_passes_every_check(merged_toy):
    folder, args, *_ = merged_toy
    for command in ("drift", "evaluate-individual", "evaluate-merged"):
        cli.main(_command_args(command, folder, args))
        assert (folder / f"{command}.parquet").is_file()
