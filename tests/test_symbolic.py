"""The SymPy forms against the numeric functions, and the proofs' algebra, recomputed."""

import math
import subprocess
import sys

import pytest
import sympy as sp

from dpcost import core
from dpcost import symbolic as sym

SIZES = [0, 1, 1e3, 4e6, 1.5e9]
GPUS = list(range(1, 17)) + [64, 1024]

VOLUME_FORMS = [
    (sym.dp_volume_expr, core.dp_communication_volume),
    (sym.ddp_volume_expr, core.ddp_communication_volume),
    (sym.reduction_factor_expr, core.communication_reduction_factor),
]
MEMORY_FORMS = [
    (sym.dp_gpu0_memory_multiplier_expr, core.dp_gpu0_memory_multiplier),
    (sym.ddp_gpu0_memory_multiplier_expr, core.ddp_gpu0_memory_multiplier),
]


@pytest.mark.parametrize(("form", "numeric"), VOLUME_FORMS)
def test_volume_forms_match_numeric_functions(form, numeric):
    evaluate = sp.lambdify((sym.P, sym.n), form(), modules="math")
    for size in SIZES:
        for n in GPUS:  # n = 1 included: the plain formulas already give 0, 0 and 1 there
            expected = numeric(size, n)
            assert math.isclose(float(evaluate(size, n)), expected, rel_tol=1e-12), (size, n)


@pytest.mark.parametrize(("form", "numeric"), MEMORY_FORMS)
def test_memory_forms_match_numeric_functions(form, numeric):
    evaluate = sp.lambdify(sym.n, form(), modules="math")
    for n in GPUS:
        assert float(evaluate(n)) == numeric(n)


def test_reduction_factor_is_exactly_n():
    ratio = sym.reduction_factor_ratio()
    assert ratio != sym.n  # the unsimplified quotient is not already n: there is a step to prove
    assert sym.P in ratio.free_symbols
    assert sym.reduction_factor_simplified() == sym.n  # structural equality
    assert sym.reduction_factor_expr() == sym.n
    assert sp.simplify(ratio - sym.n) == 0
    # The model size cancels: the ratio does not change with P.
    assert sp.simplify(sp.diff(ratio, sym.P)) == 0
    # Where the naive quotient is 0/0 (P = 0, or n = 1) the simplified factor still gives n.
    assert ratio.subs(sym.P, 0) is sp.nan
    assert ratio.subs(sym.n, 1) is sp.nan


def test_ratio_is_the_quotient_of_the_volumes():
    quotient = sp.Mul(sym.dp_volume_expr(), 1 / sym.ddp_volume_expr(), evaluate=False)
    assert sp.simplify(quotient - sym.reduction_factor_ratio()) == 0
    for n in [2, 3, 8, 1024]:
        assert sym.reduction_factor_ratio().subs({sym.P: 12345, sym.n: n}) == n


def test_limits():
    got = sym.limits()
    assert got["ddp_volume"] == 2 * sym.P
    assert got["dp_volume"] is sp.oo
    assert got["reduction_factor"] is sp.oo
    assert got["dp_gpu0_memory_multiplier"] is sp.oo
    assert got["ddp_gpu0_memory_multiplier"] == 1
    assert got["time_ratio_large_S"] == sym.n
    assert got["time_ratio_small_S"] == 1
    # DDP's volume approaches 2P from below: the gap is 2P/n, checked numerically.
    for n in [1, 2, 10, 1000]:
        gap = 2 * 7.0 - core.ddp_communication_volume(7.0, n)
        assert math.isclose(gap, 2 * 7.0 / n, rel_tol=1e-12)


def test_ring_traffic_meets_the_lower_bound():
    ring = sym.ring_traffic()
    bound = sym.allreduce_lower_bound()
    assert isinstance(ring["reduce_scatter"], sp.Sum)
    assert sp.simplify(ring["reduce_scatter"].doit() - (sym.n - 1) * sym.S / sym.n) == 0
    assert sp.simplify(ring["sent_per_rank"] - bound["busiest_rank_sent"]) == 0
    assert sp.simplify(ring["received_per_rank"] - bound["busiest_rank_received"]) == 0
    assert sp.simplify(ring["total"] - bound["total"]) == 0
    # The ring per rank is DDP's volume with S = P.
    assert sp.simplify(ring["sent_per_rank"].subs(sym.S, sym.P) - sym.ddp_volume_expr()) == 0


def test_lower_bound_values():
    bound = sym.allreduce_lower_bound()
    for n in [1, 2, 3, 8, 64]:
        size = 1_000_000
        values = {sym.n: n, sym.S: size}
        assert bound["messages_per_element"].subs(values) == 2 * (n - 1)
        assert bound["total"].subs(values) == 2 * (n - 1) * size
        assert bound["reduction_share"].subs(values) == sp.Rational((n - 1) * size, n)
        assert bound["result_share"].subs(values) == sp.Rational((n - 1) * size, n)
        assert bound["busiest_rank_sent"].subs(values) == sp.Rational(2 * (n - 1) * size, n)
    # n = 2: each rank must send its whole tensor once; the bound is S.
    assert sp.simplify(bound["busiest_rank_sent"].subs(sym.n, 2) - sym.S) == 0


def test_star_same_total_root_above_the_bound():
    star, ring = sym.star_traffic(), sym.ring_traffic()
    bound = sym.allreduce_lower_bound()
    assert sp.simplify(star["total"] - ring["total"]) == 0
    assert sp.simplify(star["total"] - 2 * (sym.n - 1) * sym.S) == 0
    assert sp.simplify(star["root_sent"].doit() - (sym.n - 1) * sym.S) == 0
    # The root sends n/2 times the per-direction bound; with both phases serial its link is
    # busy n times as long as a ring rank's.
    assert sp.simplify(star["root_sent"].doit() / bound["busiest_rank_sent"] - sym.n / 2) == 0
    assert sp.simplify(star["root_sent_and_received"] / ring["sent_per_rank"] - sym.n) == 0
    assert sp.simplify(star["root_sent_and_received"].subs(sym.S, sym.P)
                       - sym.dp_volume_expr()) == 0


def test_busiest_link_times():
    times = sym.busiest_link_times()
    assert times["ratio"] == sym.n
    values = {sym.n: 8, sym.S: 1.5e9, sym.beta: 25e9}
    assert math.isclose(float(times["ring"].subs(values)), 2 * 7 / 8 * 1.5e9 / 25e9)
    assert math.isclose(float(times["star"].subs(values)), 2 * 7 * 1.5e9 / 25e9)


def test_time_expressions_match_alpha_beta_module():
    alpha_beta = pytest.importorskip("dpcost.alpha_beta")
    ring = sp.lambdify((sym.S, sym.n, sym.beta, sym.alpha), sym.ring_time_expr(), "math")
    star = sp.lambdify((sym.S, sym.n, sym.beta, sym.alpha), sym.star_time_expr(), "math")
    for size in SIZES:
        for n in GPUS:
            args = (size, n, 25e9, 5e-6)
            assert math.isclose(ring(*args), sum(alpha_beta.ddp_communication_time_terms(*args)),
                                rel_tol=1e-12)
            assert math.isclose(star(*args), sum(alpha_beta.dp_communication_time_terms(*args)),
                                rel_tol=1e-12)


@pytest.mark.parametrize("num_ranks", [1, 2, 3, 4])
def test_min_messages_per_element_is_2n_minus_2(num_ranks):
    assert sym.min_messages_per_element(num_ranks) == 2 * (num_ranks - 1)


def test_symbol_assumptions():
    assert sym.n.is_integer and sym.n.is_positive
    assert sym.P.is_real and sym.P.is_nonnegative
    assert sym.S.is_real and sym.S.is_nonnegative


def test_import_dpcost_does_not_import_sympy():
    code = "import sys, dpcost; print('sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_nccl_path_ratio_and_chain():
    assert sym.nccl_path_ratio() == sym.n / (sym.n - 1)
    assert sp.limit(sym.nccl_path_ratio(), sym.n, sp.oo) == 1
    assert sym.nccl_path_ratio().subs(sym.n, 8) == sp.Rational(8, 7)
    chain = sym.chain_traffic()
    assert sp.simplify(chain["total"] - sym.star_traffic()["total"]) == 0  # same total bytes
    assert chain["root_busy"] == 2 * sym.S


def test_bucketed_and_chunked_match_the_numeric_model():
    from dpcost.alpha_beta import ddp_bucketed_time_terms, dp_chunked_time_terms

    ring = sp.lambdify((sym.S, sym.n, sym.beta, sym.alpha, sym.K),
                       sym.bucketed_ring_time_expr(), "math")
    for n in (2, 4, 8, 64):
        buckets = [2**20, 25 * 2**20, 7e6]
        assert math.isclose(ring(sum(buckets), n, 25e9, 5e-6, 3),
                            sum(ddp_bucketed_time_terms(buckets, n, 25e9, 5e-6)), rel_tol=1e-12)
        for path in ("copy", "nccl"):
            f = sp.lambdify((sym.S, sym.n, sym.beta, sym.alpha, sym.C),
                            sym.chunked_dp_time_expr(path), "math")
            size = 25 * 2**20  # 3 chunks of <= 10 MiB
            assert math.isclose(f(size, n, 25e9, 5e-6, 3),
                                sum(dp_chunked_time_terms(size, n, 25e9, 5e-6, path)),
                                rel_tol=1e-12)


@pytest.mark.parametrize("call, error, parameter", [
    (lambda: sym.min_messages_per_element(0), ValueError, "num_ranks"),
    (lambda: sym.min_messages_per_element(6), ValueError, "num_ranks"),
    (lambda: sym.min_messages_per_element(3.0), TypeError, "num_ranks"),
    (lambda: sym.chunked_dp_time_expr("tree"), ValueError, "path"),
])
def test_bad_input_names_the_parameter(call, error, parameter):
    with pytest.raises(error) as info:
        call()
    assert parameter in str(info.value)
