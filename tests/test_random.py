"""Random ops: exported as ONNX's random ops and verified by distribution (docs/design.md, "An export").

Each check runs the exported model and eager PyTorch many times and compares the
distribution of their results with ``opreg.testing.Distribution`` (its docstring states
the tests: moments, shape, per element; 200 draws, a false-alarm rate of 1e-6 per output);
every check here runs at the lowest and the newest supported opset. The wrong distributions
of issue 26 (``tests/wrong_distributions.py``) are checked at the same sample sizes, and found. At opset 22 and up
ONNX Runtime 1.32 has no CPU kernels for the random ops (microsoft/onnxruntime#32201),
so those models run in onnx's reference evaluator, and say so.
"""

from __future__ import annotations

import re

import onnx
import onnxruntime
import pytest
import torch
import torch.nn.functional as F
from onnxscript.onnx_opset import opset18 as op18
from torch import nn

import opreg
from opreg.testing import DISTRIBUTION, FAILED, PASSED, Distribution, Sample, check_samples
from tests.optest import NEWEST, OPSETS, Lambda, onnx_ops
from tests.wrong_distributions import RANDN_SIZE, WRONG, WrongDistribution

torch.manual_seed(0)

RANDOM_KERNELS_STOP = 21
"""ONNX Runtime 1.32 runs RandomNormal/Uniform(Like), Bernoulli and Multinomial up to this opset."""


def _by_distribution(fn, *samples: Sample, compare: Distribution | None = None, registry=None) -> list:
    """Every check compares: no sample fails, and each check has one compared by distribution (a check
    whose samples torch itself skipped would pass while comparing nothing)."""
    checks = check_samples(fn, samples, targets=OPSETS, compare=compare or Distribution(), registry=registry)
    assert [c.target for c in checks] == [str(opreg.Target.of(t)) for t in OPSETS]
    for check in checks:
        assert not check.failures(), str(check)
        assert check.count(DISTRIBUTION) == len(samples), f"a sample was not compared by distribution:\n{check}"
    return checks


def _statuses(checks) -> set[str]:
    return {r.status for c in checks for r in c.results}


# -- the ops ------------------------------------------------------------------------------------


def creation_ops(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.rand(3, 5),
        torch.randn(*RANDN_SIZE, dtype=torch.float64),
        torch.randn(4, dtype=torch.complex64),
        torch.randint(-3, 7, (40,)),
        torch.randint(5, (2, 20), dtype=torch.int32),
        torch.rand_like(x),
        torch.randn_like(x, dtype=torch.float16),
        torch.randint_like(x, 2, 9),
        torch.randperm(12),
    )


def distribution_ops(mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.normal(mean, 0.5),
        torch.normal(-1.0, std),
        torch.normal(mean, std),
        torch.normal(2.0, 3.0, (30,)),
        mean.clone().normal_(1.0, 2.0),
        mean.clone().uniform_(-2.0, 5.0),
        mean.clone().exponential_(2.0),
        mean.clone().geometric_(0.3),
        mean.clone().log_normal_(0.0, 0.5),
        mean.clone().cauchy_(1.0, 0.5),
        mean.clone().random_(6),
    )


def sampling_ops(p: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.bernoulli(p),
        torch.bernoulli(p, 0.25),
        p.clone().bernoulli_(p.flip(0)),
        torch.multinomial(weights, 3),
        torch.multinomial(weights[0], 2),
        F.dropout(p, 0.3, training=True),
        F.dropout(p, 1.0, training=True),
        torch.ops.aten.native_dropout(p, 0.6, True)[1],
        F.dropout2d(p.reshape(2, 2, 6), 0.5, training=True),
        F.alpha_dropout(p, 0.2, training=True),
        F.rrelu(p - 0.5, training=True),
    )


def test_creation_ops_by_distribution():
    checks = _by_distribution(creation_ops, Sample.of(torch.randn(3, 4)))
    assert _statuses(checks) == {DISTRIBUTION}  # random results are never "passed"


def test_distribution_ops_by_distribution():
    (mean,) = WRONG[0].sample().args  # the mean wrong Cauchy impls are checked with
    _by_distribution(distribution_ops, Sample.of(mean, torch.rand(4, 5) + 0.1))


def test_sampling_ops_by_distribution():
    weights = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [5.0, 1.0, 0.5, 0.0, 2.0]])
    (p,) = WRONG[3].sample().args  # the probabilities a wrong dropout is checked with
    _by_distribution(sampling_ops, Sample.of(p, weights))


def test_multinomial_with_replacement_by_distribution_where_a_runtime_runs_it():
    """ONNX Runtime's Multinomial stops at opset 21 and onnx.reference has none: checked at 18 only."""
    weights = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0]])
    (check,) = check_samples(
        lambda w: torch.multinomial(w, 6, replacement=True), [Sample.of(weights)], targets=[18], compare=Distribution()
    )
    assert [r.status for r in check.results] == [DISTRIBUTION], str(check)


@pytest.mark.parametrize("opset", OPSETS)
def test_without_replacement_every_pick_is_distinct_and_randperm_a_permutation(opset):
    program = opreg.export(
        Lambda(lambda w: (torch.multinomial(w, 5), torch.randperm(9))), (torch.rand(3, 5) + 0.1,), target=opset
    )
    for _ in range(20):
        picks, order = program.run(torch.rand(3, 5) + 0.1, runtime="auto")
        assert all(sorted(row.tolist()) == list(range(5)) for row in picks)
        assert sorted(order.tolist()) == list(range(9))


def test_scaled_dot_product_attention_with_dropout_by_distribution():
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    _by_distribution(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.4), Sample.of(q, k, v)
    )  # fmt: skip


# -- what the model holds -------------------------------------------------------------------------


@pytest.mark.parametrize("opset", OPSETS)
def test_bernoulli_and_dropout_avoid_onnx_runtimes_wrong_kernels(opset):
    """ONNX Runtime 1.32's Bernoulli draws 1 with probability 1 - p and its training-mode Dropout
    keeps or drops element 0 in every run (bench/distributions.py): both are U < p instead."""
    program = opreg.export(
        Lambda(lambda p: (torch.bernoulli(p), F.dropout(p, 0.5, training=True))), (torch.rand(8),), target=opset
    )
    ops = onnx_ops(program)
    assert "Bernoulli" not in ops and "Dropout" not in ops
    assert ops.count("RandomUniformLike") == 2 and ops.count("Less") == 2


def test_equal_draws_stay_two_draws():
    """Constant folding and CSE know RandomUniformLike, not every random op: two draws of one
    input must stay two nodes, and a draw of a constant must not be folded."""
    registry = opreg.default_registry().copy()

    def aten_bernoulli(self, generator: object = None):
        return op18.Bernoulli(self)

    registry.register("aten::bernoulli", aten_bernoulli)
    probabilities = torch.full((64,), 0.5)
    program = opreg.export(
        Lambda(lambda p: (torch.bernoulli(p), torch.bernoulli(p), torch.bernoulli(probabilities))),
        (probabilities,),
        registry=registry,
        target=18,
    )
    assert onnx_ops(program).count("Bernoulli") == 3
    first, second, _ = program.run(probabilities)
    assert not torch.equal(first, second)


# -- seeds ------------------------------------------------------------------------------------------


def _seeds(program) -> list:
    return [
        onnx.helper.get_attribute_value(a)
        for n in program.model_proto.graph.node
        for a in n.attribute
        if a.name == "seed"
    ]


def test_random_nodes_get_a_seed_only_when_asked():
    model = Lambda(lambda x: (torch.randn_like(x), torch.rand_like(x), torch.multinomial(x.abs() + 0.1, 2)))
    x = torch.randn(3, 4)
    assert _seeds(opreg.export(model, (x,), target=18)) == []
    seeded = opreg.export(model, (x,), target=18, seed=7)
    assert sorted(_seeds(seeded)) == [7.0, 8.0, 9.0]  # one stream per node

    again = opreg.export(model, (x,), target=18, seed=7)
    first, second = seeded.run(x), again.run(x)  # a new session draws the same numbers
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    later = seeded.run(x)  # and each run of a session draws new ones
    assert not torch.equal(first[0], later[0])


@pytest.mark.parametrize("opset", [18, RANDOM_KERNELS_STOP])
def test_each_run_draws_fresh_numbers(opset):
    program = opreg.export(Lambda(torch.randn_like), (torch.zeros(16),), target=opset)
    draws = [program.run(torch.zeros(16)) for _ in range(3)]
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


# -- ONNX Runtime's gap at opset 22 and up ------------------------------------------------------------


@pytest.mark.skipif(NEWEST <= RANDOM_KERNELS_STOP, reason="the newest target is one ONNX Runtime runs random ops at")
def test_random_ops_past_onnx_runtimes_kernels_run_in_the_reference_evaluator():
    program = opreg.export(Lambda(torch.rand_like), (torch.zeros(3),), target=NEWEST)
    assert program.runtime_for() == "reference"
    assert program.run(torch.zeros(3), runtime="auto").shape == (3,)
    with pytest.raises(opreg.RuntimeUnavailableError, match=r"target=21 or lower"):
        program.run(torch.zeros(3), runtime="onnxruntime")


# -- a real model: a variational autoencoder that samples its latent code --------------------------------


class VAE(nn.Module):
    """Encodes to a mean and log-variance, samples z = mu + sigma * eps with randn_like, decodes."""

    def __init__(self, features: int = 12, latent: int = 4):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(features, 16), nn.ReLU())
        self.mu = nn.Linear(16, latent)
        self.log_var = nn.Linear(16, latent)
        self.decoder = nn.Sequential(nn.Linear(latent, 16), nn.ReLU(), nn.Linear(16, features), nn.Sigmoid())

    def forward(self, x):
        hidden = self.encoder(x)
        mu, log_var = self.mu(hidden), self.log_var(hidden)
        z = mu + torch.exp(0.5 * log_var) * torch.randn_like(mu)
        return self.decoder(z), mu, log_var


def test_vae_samples_like_eager_pytorch():
    vae = VAE().eval()
    checks = _by_distribution(vae, Sample.of(torch.randn(3, 12)))
    # mu and log_var are deterministic: they are compared by distribution too, as parts of a random sample
    assert all(c.count(DISTRIBUTION) == 1 for c in checks)


def test_vae_exports_with_a_dynamic_batch():
    vae = VAE().eval()
    batch = torch.export.Dim("batch")
    program = opreg.export(vae, (torch.randn(3, 12),), target=18, dynamic_shapes={"x": {0: batch}})
    decoded, mu, _ = program.run(torch.randn(7, 12))
    assert decoded.shape == (7, 12) and mu.shape == (7, 4)
    assert "RandomNormalLike" in onnx_ops(program)


# -- the comparison itself ------------------------------------------------------------------------------


def test_distribution_fails_a_wrong_distribution():
    """A rand_like that draws from N(0, 1) instead of U[0, 1) matches in shape and dtype, never in
    distribution; nor does a dropout that keeps with probability p instead of 1 - p."""
    registry = opreg.default_registry().copy()

    def normal_instead(self, dtype: int | None = None, layout: int | None = None, device: str | None = None,
                       pin_memory: bool | None = None, memory_format: str | None = None):  # fmt: skip
        return op18.RandomNormalLike(self)

    def keeps_p(input, p: float, train: bool):
        keep = op18.Less(op18.RandomUniformLike(input), p)
        return op18.Div(op18.Mul(input, op18.CastLike(keep, input)), 1.0 - p)

    registry.register("aten::rand_like", normal_instead)
    registry.register("aten::dropout", keeps_p)
    for fn in (torch.rand_like, lambda x: F.dropout(x, 0.2, training=True)):
        (check,) = check_samples(fn, [Sample.of(torch.ones(50))], targets=[18], compare=Distribution(),
                                 registry=registry)  # fmt: skip
        (result,) = check.results
        assert result.status == FAILED, str(check)


WRONG_FOUND_BY = {
    "Cauchy with swapped parameters": r"fraction at or below each decile \(p=",
    "Cauchy with 3x the scale": r"fraction at or below each decile \(p=",
    "uniform with the normal's mean and variance": r"fraction at or below each decile \(p=",
    "dropout 0.25 instead of 0.3": r"fraction of zeros 0\.2\d* vs eager 0\.3",
}
"""The test each wrong distribution fails (in this seeded run): the shape, where the moments agree."""


@pytest.mark.parametrize("case", WRONG, ids=lambda c: c.name)
def test_issue_26s_wrong_distributions_are_found(case: WrongDistribution):
    """Each wrong impl, at the sample size the suite checks the right one with, seeded: one
    deterministic run. ``bench/distribution_power.py`` counts how often over 20 seeds."""
    (check,) = check_samples(case.fn, [case.sample()], targets=[18], compare=Distribution(), registry=case.registry())
    (result,) = check.results
    assert result.status == FAILED, str(check)
    assert re.search(WRONG_FOUND_BY[case.name], result.detail), result.detail


@pytest.mark.parametrize("case", [c for c in WRONG if "Cauchy" in c.name or "uniform" in c.name], ids=lambda c: c.name)
def test_moments_alone_miss_a_wrong_shape(case: WrongDistribution):
    """What the shape tests are for: the moments (means, mean squares, zeros, per-element means)
    of these wrong distributions agree with eager's in this seeded run."""
    compare = Distribution(shape=False)
    (check,) = check_samples(case.fn, [case.sample()], targets=[18], compare=compare, registry=case.registry())
    assert [r.status for r in check.results] == [DISTRIBUTION], str(check)


def test_distribution_reports_which_statistic_and_needs_the_shape():
    compare = Distribution(draws=50)
    ones = [[torch.ones(4)] for _ in range(50)]
    halves = [[torch.full((4,), 0.5)] for _ in range(50)]
    problems, _ = compare.judge(ones, halves, 1e-5, 1e-5)
    assert any(p.startswith("output 0: mean 1 vs eager 0.5") for p in problems)
    assert compare.judge([[torch.ones(3)]] * 50, ones, 1e-5, 1e-5)[0] == [
        "output 0: torch.float32(3,) != torch.float32(4,)"
    ]
    same, summary = compare.judge(ones, ones, 1e-5, 1e-5)
    assert same == [] and "by distribution over 50 draws" in summary


def test_deterministic_samples_of_a_random_op_are_compared_by_value():
    """dropout in eval, or with p = 0, is the identity: its samples pass value by value."""
    checks = check_samples(
        lambda x, train: F.dropout(x, 0.0, training=train),
        [Sample.of(torch.randn(5), True), Sample.of(torch.randn(5), False)],
        targets=OPSETS,
        compare=Distribution(),
    )
    assert _statuses(checks) == {PASSED}


def test_onnx_runtimes_seed_makes_a_check_reproducible():
    def draws() -> list[torch.Tensor]:
        onnxruntime.set_seed(3)
        program = opreg.export(Lambda(torch.rand_like), (torch.zeros(5),), target=18)
        return [program.run(torch.zeros(5)) for _ in range(3)]

    assert all(torch.equal(a, b) for a, b in zip(draws(), draws(), strict=True))


def test_verify_of_a_random_model_says_how_to_check_it():
    program = opreg.export(Lambda(lambda x: x + torch.randn_like(x)), (torch.zeros(8),), target=18)
    with pytest.raises(opreg.VerificationError, match=r"RandomNormalLike.*in distribution.*Distribution\(\)"):
        program.verify(torch.zeros(8))


# -- the default target: random ops where ONNX Runtime runs them ---------------------------------------


class NormalSample(nn.Module):
    """torch.distributions.Normal's sample (torch.onnx's test of it): RandomNormalLike, scaled and shifted."""

    def forward(self, loc, scale):
        return torch.distributions.Normal(loc, scale, validate_args=False).sample()


NORMAL_ARGS = (torch.full((64,), 3.0), torch.linspace(0.5, 2.0, 64))


def test_the_default_target_exports_random_ops_at_the_opset_onnx_runtime_runs():
    """The ``onnx`` profile is a ceiling: a model that draws random numbers imports the opset its nodes
    need (RandomNormalLike emitted with op18 is RandomNormalLike-1), where ONNX Runtime 1.32 has kernels
    for them, and its draws have eager's distribution there."""
    program = opreg.export(NormalSample(), NORMAL_ARGS)
    assert program.model.opset_imports[""] < 22  # RandomNormalLike-22 has no CPU kernel
    assert "RandomNormalLike" in onnx_ops(program) and program.runtime_for() == "onnxruntime"
    onnxruntime.set_seed(0)
    torch.manual_seed(0)
    got = [[program.run(*NORMAL_ARGS, runtime="onnxruntime")] for _ in range(200)]
    expected = [[NormalSample()(*NORMAL_ARGS)] for _ in range(200)]
    problems, summary = Distribution().judge(got, expected, 1e-5, 1e-5)
    assert not problems, (problems, summary)


@pytest.mark.parametrize("target", ["onnx,ai.onnx=23", 23, {"": 23}, "23"], ids=repr)
def test_a_target_that_names_its_onnx_version_keeps_it(target):
    program = opreg.export(NormalSample(), NORMAL_ARGS, target=target)
    assert program.model.opset_imports[""] == 23 and program.runtime_for() == "reference"


def test_a_profile_of_a_pack_is_lowered_too():
    if "onnxruntime" not in opreg.default_registry().profiles:
        pytest.skip("opreg-ort-contrib is not installed")
    program = opreg.export(NormalSample(), NORMAL_ARGS, target="onnxruntime")
    assert program.model.opset_imports[""] < 22 and program.runtime_for() == "onnxruntime"


@torch.library.custom_op("opreg_random_tests::doubled", mutates_args=())
def _doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_doubled.register_fake
def _(x):
    return torch.empty_like(x)


def test_a_release_target_refuses_random_ops_an_impl_forces_to_their_new_version():
    """An impl that needs ai.onnx 23 lifts the model there, where RandomNormalLike reads as
    RandomNormalLike-22: at a target naming an ONNX Runtime release, the export is refused naming
    the op and the release, not left to fail in the runtime."""
    registry = opreg.default_registry().copy()

    def doubled_23(x):
        """doubled(Tensor x) -> Tensor, with an op of ai.onnx 23."""
        from onnxscript.onnx_opset import opset23 as op23

        return op23.Cast(op23.Cast(x, to=10), to=1)  # Cast-23 (through float16, so it stays): ai.onnx 23

    registry.register("opreg_random_tests::doubled", doubled_23, opset=23)
    model = Lambda(lambda loc, scale: torch.ops.opreg_random_tests.doubled(NormalSample()(loc, scale)))
    program = opreg.export(model, NORMAL_ARGS, registry=registry)
    assert program.model.opset_imports[""] == 23 and program.runtime_for() == "reference"  # no release named
    with pytest.raises(opreg.OpsetConflictError, match=r"RandomNormalLike-22 .*onnxruntime 1\.24\.4 has no CPU kernel"):
        opreg.export(model, NORMAL_ARGS, registry=registry, target="onnx@onnxruntime==1.24")


def test_the_kernel_tables_say_what_onnx_runtime_says_of_random_ops():
    """Every random op opreg emits has a CPU kernel at its schema before ai.onnx 22 in each release
    the tables hold, and none at its version 22; the installed release's table agrees."""
    from opreg.exporter import _kernels
    from opreg.registry import runtimes

    ops = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial")
    for release in runtimes.releases():
        assert all(release.runs("", op, onnx.defs.get_schema(op, 21, "").since_version) for op in ops), release
        assert not any(release.runs("", op, 22) for op in ops), release
    assert all(_kernels.runs(op, onnx.defs.get_schema(op, 21, "").since_version, {}) for op in ops)
    assert not any(_kernels.runs(op, 22, {}) for op in ops)


@pytest.mark.parametrize(
    ("spec", "pinned"),
    [("onnx", False), ("onnxruntime", False), ("onnx,com.microsoft=1", False), ("onnx,25", True),
     ("onnx, ai.onnx=25", True), ("20", True), (20, True), ({"": 20}, True), ("onnxruntime==1.22", False),
     ("onnx@onnxruntime==1.22", False), ("onnxruntime==1.22,ai.onnx=20", True),
     (opreg.Target.of("onnx"), False), (opreg.Target.of("onnx,25"), True), (opreg.Target.of({"": 23}), True)],
    ids=repr,
)  # fmt: skip
def test_what_names_the_onnx_version(spec, pinned):
    registry = opreg.default_registry()
    if "onnxruntime" in str(spec) and "onnxruntime" not in registry.profiles:
        pytest.skip("opreg-ort-contrib is not installed")
    assert registry.target(spec).pinned is pinned
