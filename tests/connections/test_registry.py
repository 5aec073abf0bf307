"""Every registered design, both layouts: builds, keeps the shape, back-propagates, round-trips its spec."""

import re

import pytest
import torch

import skiplab
from skiplab.connections import REGISTRY, parse_spec
from tests.conftest import DIM, make_branch, make_input, randomise_affine

# At least one spec per registered name; test_every_design_has_an_example keeps this list complete.
EXAMPLES = [
    "NoSkip", "1xSkip", "Residual", "2xSkip", "0.5xSkip", "1xSkip+LN", "PostLN", "2xSkip+LN", "2xSkip+BN",
    "2xSkip+RMS", "0.5xSkip+LN(f=2)", "1xSkip(f=2)", "1rSkip+LN", "2rSkip+LN", "3rSkip+LN", "2rSkip+BN",
    "2rSkip+RMS", "wSkip+LN", "wSkip+LN(init=2)", "wSkip", "wSkip+BN", "SAS", "SAS(gate=single)",
    "SAS(gamma=free)", "SAS+BN", "SAS+RMS", "Highway", "Highway(bias=-1)", "PreLN", "PreRMS",
    "ReZero", "ReZero(init=0.5)", "ReZero(share=sublayer)", "SkipInit", "LayerScale", "LayerScale+RMS(init=0.1)", "PreLN(scale=depth)", "LNS",
    "PreRMS(scale=depth)", "MixLN", "MixLN+RMS(alpha=0.5)", "DeepNorm", "DeepNorm+RMS",
    "PeriLN", "PeriLN+RMS(embed=no)", "SandwichLN", "PreDyT", "1xSkip+DyT", "SAS+DyT", "MixLN+DyT", "DeepNorm+DyT",
    "PreDyT(alpha0=llm)", "MixLN+DyT(alpha0=1)", "LNS+RMS",
    "Admin", "Admin+RMS(init=profile)", "HC", "HC(n=2,kind=static)", "HC(n=2,tanh=no)", "HC+RMS(n=1)", "mHC", "mHC(n=2,iters=5)",
    "Keel", "Keel+RMS", "LAuReL", "LAuReL+RMS(form=lr,rank=2)", "LAuReL(form=lr,rank=3,norm=rms)", "LAuReL(form=pa,rank=2,k=3)",
    "HybridNorm", "HybridNorm+RMS(star=yes)", "nGPT",
]


def test_every_design_has_an_example():
    covered = {parse_spec(s).name for s in EXAMPLES}
    assert covered == set(REGISTRY), f"add an example for {set(REGISTRY) - covered}"


def test_available_connections_lists_every_design_with_a_formula():
    table = skiplab.available_connections()
    for cls in REGISTRY.values():
        assert cls.patterns and all(table[p] == f for p, f in cls.patterns.items()), cls.name
    for pattern in ["λxSkip", "λxSkip+LN", "λxSkip+BN", "krSkip+LN", "krSkip+BN", "SAS", "SAS+BN", "Highway", "PreLN"]:
        assert pattern in table
    assert table["PostLN"] == "alias of 1xSkip+LN" and table["Residual"] == "alias of 1xSkip"


def build(spec, layout):
    """The connection, or None where the design has no such layout (hyper-connections' streams: seq only)."""
    if layout == "conv" and REGISTRY[parse_spec(spec).name].needs_stack:
        with pytest.raises(ValueError, match="no conv layout"):
            skiplab.connection(spec, DIM, layout=layout)
        return None
    return skiplab.connection(spec, DIM, layout=layout)


def call(conn, x, branch):
    """conn(x, branch) inside the stack its design needs: HC's input expanded to n streams, summed after."""
    if not conn.needs_stack:
        return conn(x, branch)
    return conn(skiplab.input_norm(conn.spec, DIM)(x), branch).sum(-2)


@pytest.mark.parametrize("spec", EXAMPLES)
def test_a_branch_of_the_wrong_shape_is_one_line(spec, layout):
    """What the branch returns is checked against what it was given: a (…, 1) or batch-1 output was broadcast into
    the stream silently by most designs, another width failed inside a gate's matmul, and HC's stream kernel read
    past the end of a short output (uninitialised values, no error)."""
    conn = build(spec, layout)
    if conn is None:
        return
    x, branch = make_input(layout), make_branch(layout)
    for wrong in (lambda h: branch(h)[..., :1] if layout == "seq" else branch(h)[:, :1],  # one feature
                  lambda h: branch(h)[:1],  # one example of the batch
                  lambda h: branch(h)[:, :2] if layout == "seq" else branch(h)[..., :2]):  # fewer positions
        with pytest.raises(ValueError, match=r"^[^\n]*: the branch returned shape \(.*\) for an input of shape "
                                             r"\(.*\); it must return \([^\n]*$"):
            call(conn, x, wrong)


@pytest.mark.parametrize("spec", EXAMPLES)
def test_a_skip_of_the_wrong_shape_and_a_branch_that_is_no_function_are_one_line(spec, layout):
    """The skip path is checked as the branch is (a batch-1 or one-feature skip was broadcast into the stream, a
    projection without the branch's stride failed inside the add); a branch that is not callable, or returns no
    tensor, is named too, and a width change without a projection skip."""
    conn = build(spec, layout)
    if conn is None or conn.needs_stack:
        return
    x, branch = make_input(layout), make_branch(layout)
    for wrong in (lambda h: h[..., :1] if layout == "seq" else h[:, :1], lambda h: h[:1]) if conn.has_skip else ():
        with pytest.raises(ValueError, match=r"^[^\n]*: the skip returned shape \(.*\) for an input of shape "
                                             r"\(.*\); it must return \([^\n]*$"):
            conn(x, branch, skip=wrong)
    if layout == "conv" and conn.has_skip:  # a projection without the branch's stride (NoSkip reads no skip)
        n = x.shape[0]
        with pytest.raises(ValueError, match=rf": the (skip returned shape \({n}, {DIM}, 2, 3\) and the branch "
                                             rf"\({n}, {DIM}, 3, 3\)|branch returned shape \({n}, {DIM}, 3, 3\) and "
                                             rf"the skip \({n}, {DIM}, 2, 3\)) for an input of shape .*; the two are "
                                             "added, so their shapes must agree"):
            conn(x, branch, skip=lambda h: h[:, :, :2])
    for bad, said in ((None, "the branch must be a callable (a module or function) mapping x to F(x); it got NoneType"),
                      (x, "the branch must be a callable (a module or function) mapping x to F(x); it got Tensor")):
        with pytest.raises(TypeError, match=re.escape(f"{conn.spec}: {said}")):
            conn(x, bad)
    with pytest.raises(TypeError, match=re.escape(f"{conn.spec}: the branch returned tuple, not a tensor")):
        conn(x, lambda h: (branch(h), h))
    with pytest.raises(TypeError, match=re.escape(f"{conn.spec}: skip must be a callable")):
        conn(x, branch, skip=x)
    if conn.has_skip and "norm=rms" not in spec:  # LAuReL's RMS term refuses another width when it is built
        wide = skiplab.connection(spec, DIM, layout=layout, in_dim=DIM + 1)
        with pytest.raises(ValueError, match=re.escape(f"was built with in_dim {DIM + 1} and dim {DIM}: a block that "
                                                       "changes the width needs a projection skip")):
            wide(torch.randn(2, DIM + 1, 3, 3) if layout == "conv" else torch.randn(2, 3, DIM + 1), branch)


@pytest.mark.parametrize("spec", EXAMPLES)
def test_shapes_are_worked_out_on_the_meta_device(spec, layout):
    """Tensors without data (shape inference, FLOP counts): krSkip, SAS, HC and mHC asked autocast about the meta
    device, which torch answers with "unknown device type for autocast"."""
    conn = build(spec, layout)
    if conn is None:
        return
    conn = conn.to("meta")
    x = make_input(layout).detach().to("meta")
    branch = make_branch(layout).to("meta")
    if conn.needs_stack:
        y = conn(skiplab.input_norm(conn.spec, DIM).to("meta")(x), branch).sum(-2)
    else:
        y = conn(x, branch)
    assert y.device.type == "meta" and y.shape == x.shape


@pytest.mark.parametrize("spec", EXAMPLES)
def test_shape_gradients_and_round_trip(spec, layout):
    conn = build(spec, layout)
    if conn is None:
        return
    x, branch = make_input(layout), make_branch(layout)
    y = call(conn, x, branch)
    assert y.shape == x.shape
    (y * torch.randn_like(y)).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in conn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name

    again = skiplab.connection(conn.spec, DIM, layout=layout)
    assert again.spec == conn.spec and type(again) is type(conn)
    again.load_state_dict(conn.state_dict())  # same parameters and buffers, same shapes
    conn.eval(), again.eval()
    with torch.no_grad():
        torch.testing.assert_close(call(again, x, branch), call(conn, x, branch))


@pytest.mark.parametrize("spec", EXAMPLES)
def test_an_empty_batch_gives_an_empty_output(spec, layout):
    """No examples (a data loader's last, empty shard): an empty output of the input's shape and an empty gradient,
    in training and evaluation, as torch's own layers give, not an index or size error."""
    conn = build(spec, layout)
    if conn is None:
        return
    full = make_input(layout)
    x = full.detach()[:0].requires_grad_()
    branch = make_branch(layout)
    for training in (True, False):
        conn.train(training)
        y = call(conn, x, branch)
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape
        x.grad = None


@pytest.mark.parametrize("spec", EXAMPLES)
def test_stats_before_and_after_a_forward(spec, layout):
    conn = build(spec, layout)
    if conn is None:
        return
    before = conn.stats()
    call(conn, make_input(layout), make_branch(layout))
    after = conn.stats()
    assert set(before) == set(after)
    for key, value in after.items():
        assert value is not None, key
        assert torch.isfinite(torch.as_tensor(value)).all(), key


def test_projection_skip_replaces_x_on_the_skip_path(layout):
    proj = make_branch(layout, seed=5)
    x, branch = make_input(layout), make_branch(layout)
    for spec, expect in [
        ("1xSkip", lambda: proj(x) + branch(x)),
        ("3xSkip", lambda: 3 * proj(x) + branch(x)),
        ("NoSkip", lambda: branch(x)),
    ]:
        torch.testing.assert_close(skiplab.connection(spec, DIM, layout)(x, branch, skip=proj), expect())


def test_iter_connections_finds_every_block():
    blocks = torch.nn.ModuleList(skiplab.connection(s, DIM) for s in ["1xSkip", "2rSkip+LN", "SAS"])
    found = list(skiplab.iter_connections(blocks))
    assert [n for n, _ in found] == ["0", "1", "2"]
    assert [c.spec for _, c in found] == ["1xSkip", "2rSkip+LN", "SAS"]


@pytest.mark.parametrize("spec", EXAMPLES)
def test_an_input_of_another_width_is_refused_in_one_line(spec, layout):
    """Not a shape error from inside a gate's matmul, and not a silent result from a design without weights."""
    conn = build(spec, layout)
    if conn is None or conn.needs_stack:  # the streams' design checks its own (test_hyper_mix.py)
        return
    x = make_input(layout, dim=DIM + 1).detach()
    with pytest.raises(ValueError, match=rf"built for {DIM} features on .*got an input of shape \({', '.join(map(str, x.shape))}\)"):
        conn(x, lambda h: h)


@pytest.mark.parametrize("spec", EXAMPLES)
def test_a_strided_view_gives_what_its_contiguous_copy_gives(spec, layout):
    """A view whose strides are neither contiguous nor channels-last (the conv layout's H and W swapped; the seq
    layout's T and B): the same output and gradient as its contiguous copy (the group norm's own kernel refused it)."""
    conn = build(spec, layout)
    if conn is None:
        return
    base = make_input(layout).detach().requires_grad_()
    x = base.transpose(2, 3) if layout == "conv" else base.transpose(0, 1)
    x_copy = x.detach().contiguous().requires_grad_()
    assert not x.is_contiguous()
    branch = make_branch(layout)
    y, y_copy = call(conn, x, branch), call(conn, x_copy, branch)
    torch.testing.assert_close(y, y_copy)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    (g,) = torch.autograd.grad((y * w).sum(), x)
    (g_copy,) = torch.autograd.grad((y_copy * w).sum(), x_copy)
    torch.testing.assert_close(g, g_copy)


@pytest.mark.parametrize("spec", EXAMPLES)
def test_cpu_autocast_runs_every_design_close_to_float32(spec, layout):
    """Under bf16 autocast (a bf16 branch beside a float32 stream): finite, close to the float32 result."""
    conn = build(spec, layout)
    if conn is None:
        return
    x, branch = make_input(layout).detach(), make_branch(layout)
    conn.eval()  # BatchNorm: the same (running) statistics both times
    with torch.no_grad():
        want = call(conn, x, branch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = call(conn, x, branch)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, rtol=0.1, atol=0.1 * want.abs().max().item())


@pytest.mark.parametrize("spec", [s for s in EXAMPLES if "+BN" in s])
def test_batchnorm_refuses_one_value_per_feature_in_training_and_keeps_its_statistics(spec, layout):
    """As nn.BatchNorm refuses it (the variance of one value is 0/0): one line, and the running statistics untouched
    (krSkip+BN wrote NaN into them, silently, and every later evaluation gave NaN)."""
    conn = build(spec, layout)
    one = make_input(layout).detach()[:1, :1] if layout == "seq" else make_input(layout).detach()[:1, :, :1, :1]
    before = {k: v.clone() for k, v in conn.state_dict().items()}
    with pytest.raises((ValueError, RuntimeError), match="more than (one|1) value per (feature|channel)"):
        conn(one, lambda h: 0.5 * h)
    for k, v in conn.state_dict().items():
        if "num_batches_tracked" not in k:
            assert torch.equal(v, before[k]), k


def test_with_a_projection_skip_the_input_is_the_branchs_and_the_skips_unless_in_dim_is_given():
    """A block that changes the width (the README's tour): x at 4 features, the skip and the branch map it to 8; with
    no in_dim the connection reads only their outputs, so x's width is theirs to check; with in_dim it is checked."""
    torch.manual_seed(0)
    proj, body = torch.nn.Conv2d(4, 8, 1), torch.nn.Conv2d(4, 8, 3, padding=1)
    x = torch.randn(2, 4, 5, 5)
    assert skiplab.connection("SAS", 8, layout="conv")(x, body, skip=proj).shape == (2, 8, 5, 5)
    assert skiplab.connection("SAS", 8, layout="conv", in_dim=4)(x, body, skip=proj).shape == (2, 8, 5, 5)
    with pytest.raises(ValueError, match=r"built for 4 features on axis 1 .* shape \(2, 5, 5, 5\)"):
        skiplab.connection("SAS", 8, layout="conv", in_dim=4)(torch.randn(2, 5, 5, 5), body, skip=proj)
    with pytest.raises(ValueError, match="built for 8 features"):  # no skip: x is the connection's own
        skiplab.connection("SAS", 8, layout="conv")(x, body)


@pytest.mark.parametrize("spec", EXAMPLES)
def test_a_design_that_reads_x_itself_names_in_dim_when_a_projection_skip_changes_the_width(spec, layout):
    """A pre-norm design normalises x before the branch, so a projection skip that changes the width needs
    in_dim: without it, one line that says so (not the norm's shape error); with it, the block runs. A design that
    reads only the skip's and the branch's outputs runs either way."""
    conn = build(spec, layout)
    if conn is None or conn.needs_stack:
        return
    torch.manual_seed(0)
    wide, narrow = DIM, DIM // 2
    body, proj = ((torch.nn.Linear(narrow, wide), torch.nn.Linear(narrow, wide)) if layout == "seq" else
                  (torch.nn.Conv2d(narrow, wide, 1), torch.nn.Conv2d(narrow, wide, 1)))
    x = make_input(layout, dim=narrow).detach()
    if not conn.reads_input:
        assert conn(x, body, skip=proj).shape[:2] == proj(x).shape[:2]
        return
    with pytest.raises(ValueError, match=r"with a projection skip that changes the width, give in_dim"):
        conn(x, body, skip=proj)
    if "norm=rms" in spec:  # LAuReL's normalised linear term needs x at the output's width: refused when built
        return
    again = skiplab.connection(spec, wide, layout=layout, in_dim=narrow, place=conn.place)
    assert again(x, body, skip=proj).shape == proj(x).shape


@pytest.mark.parametrize("spec", [s for s in EXAMPLES if not REGISTRY[parse_spec(s).name].needs_stack])
def test_conv_gradients_do_not_depend_on_the_memory_format(spec):
    """Channels-last feature maps (a channels-last stem, or a gradient coming back channels-last) give the values
    and gradients of contiguous ones, in float64 against the connection's own plain formula: SAS's fused backward
    handed the group norm a gradient in another memory format than its input and was 0.26 off."""
    torch.manual_seed(0)
    conn = skiplab.connection(spec, DIM, layout="conv").double()
    branch = make_branch("conv").double()
    x = make_input("conv").detach().double()
    w = torch.randn(x.shape, dtype=torch.float64)
    last = torch.channels_last

    def run(x, w):
        x = x.clone().requires_grad_()
        y = conn(x, branch)
        return y.detach(), torch.autograd.grad((y * w).sum(), [x, *conn.parameters()], allow_unused=True)

    conn.eval()  # BatchNorm: the same (running) statistics every time
    with skiplab.plain_formulas():
        want_y, want = run(x, w)
    for xf, wf in [(last, torch.contiguous_format), (torch.contiguous_format, last), (last, last)]:
        y, got = run(x.contiguous(memory_format=xf), w.contiguous(memory_format=wf))
        torch.testing.assert_close(y, want_y)
        for g, h in zip(got, want):
            assert (g is None) == (h is None)
            if g is not None:
                torch.testing.assert_close(g, h)


@pytest.mark.parametrize("spec", [s for s in EXAMPLES if not REGISTRY[parse_spec(s).name].needs_stack])
def test_conv_designs_treat_one_and_three_spatial_axes_as_two(spec):
    """The conv layout is (N, C, ...): on (N, C, L) and (N, C, D, H, W) a design computes what it does on the same
    values with a spatial axis of length 1 added (or the last two merged), its per-channel parameters along axis 1;
    with N = C, a DyT or nGPT rate viewed for four axes put them along the batch axis of a 3-d input, silently.
    BatchNorm's 2-d form takes four axes only: the others are refused, not misread."""
    torch.manual_seed(0)
    conn = skiplab.connection(spec, DIM, layout="conv")
    randomise_affine(conn)
    conn.eval()
    branch = lambda h: 0.5 * torch.tanh(h)  # noqa: E731  any number of axes
    x3 = torch.randn(DIM, DIM, 5) * 1.3 + 0.2
    x5 = torch.randn(2, DIM, 2, 3, 4)
    if "BN" in spec:
        for x in (x3, x5):
            with pytest.raises((ValueError, RuntimeError), match="4D"):
                conn(x, branch)
        return
    with torch.no_grad():
        torch.testing.assert_close(conn(x3, branch), conn(x3.unsqueeze(-1), branch).squeeze(-1))
        torch.testing.assert_close(conn(x5, branch), conn(x5.flatten(3), branch).view(x5.shape))


@pytest.mark.parametrize("spec", EXAMPLES)
def test_torch_func_grad_equals_autograds_for_every_design(spec, layout):
    """``torch.func.grad`` over ``functional_call`` (the way a meta-learning or per-example-gradient user calls a
    module): the fused functions and kernels step aside for their plain formulas under a transform (they refused it:
    "an autograd.Function ... must override the setup_context staticmethod"), so the gradient is autograd's own."""
    conn = build(spec, layout)
    if conn is None:
        return
    randomise_affine(conn)
    branch = make_branch(layout)
    x = make_input(layout).detach()
    if conn.needs_stack:
        x = skiplab.input_norm(conn.spec, DIM)(x)
    params = {k: v.detach() for k, v in conn.named_parameters()}

    def loss(p, x):  # the buffers passed too (BatchNorm updates its running statistics in place)
        buffers = {k: v.clone() for k, v in conn.named_buffers()}
        y = torch.func.functional_call(conn, {**p, **buffers}, (x, branch))
        return (y * torch.linspace(-1, 1, y.shape[-1])).square().sum()

    got_p, got_x = torch.func.grad(loss, argnums=(0, 1))(params, x)
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    xl = x.clone().requires_grad_()
    want = torch.autograd.grad(loss(leaves, xl), [*leaves.values(), xl], allow_unused=True)
    for (name, g), w in zip(got_p.items(), want):
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w, msg=name)
    torch.testing.assert_close(got_x, want[-1])
